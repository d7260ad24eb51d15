//! Privileged: ferro-cni's blocking netlink client against the kernel, inside a namespace the
//! test creates (the test thread enters it; nothing touches the root namespace).
#![allow(clippy::unwrap_used)]

use ferro_cni::nlsock::{NlSocket, Request};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use rtnetlink::{LinkBridge, LinkUnspec};

const ENODEV: i32 = 19;
const EEXIST: i32 = 17;

fn names(links: &[RouteNetlinkMessage]) -> Vec<String> {
    links
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn a_batch_answers_every_request_in_order_and_a_failure_does_not_stop_the_rest() {
    let ns = ferro_lab::netns::NetNs::new(&format!("ferro-nls-{}", std::process::id())).unwrap();
    // A thread of its own enters the namespace, so the test harness's threads stay put.
    ns.spawn_in(move || {
        let mut sock = NlSocket::open().unwrap();
        let create = || {
            Request::new(
                RouteNetlinkMessage::NewLink(LinkBridge::new("fcnl0").build()),
                NLM_F_CREATE | NLM_F_EXCL,
            )
        };
        let answers = sock
            .batch(vec![
                create(),
                create(),
                Request::new(
                    RouteNetlinkMessage::SetLink(LinkUnspec::new_with_name("fcnl0").up().build()),
                    0,
                ),
            ])
            .unwrap();
        assert_eq!(answers.len(), 3);
        assert!(answers[0].is_ok(), "{:?}", answers[0]);
        assert_eq!(answers[1].as_ref().unwrap_err().errno(), Some(EEXIST));
        assert!(answers[2].is_ok(), "the request after a failed one ran: {:?}", answers[2]);

        let link = sock.link_by_name("fcnl0").unwrap().unwrap();
        assert!(link.header.flags.contains(LinkFlags::Up));
        assert_eq!(
            sock.link_by_index(link.header.index).unwrap().unwrap().header.index,
            link.header.index
        );
        assert!(sock.link_by_name("fcnl-none").unwrap().is_none());

        // A GET that fails, a dump and a delete in one datagram.
        let mut missing = LinkMessage::default();
        missing
            .attributes
            .push(LinkAttribute::IfName("fcnl-none".into()));
        let mut del = LinkMessage::default();
        del.header.index = link.header.index;
        let answers = sock
            .batch(vec![
                Request::get(RouteNetlinkMessage::GetLink(missing)),
                Request::new(RouteNetlinkMessage::GetLink(LinkMessage::default()), NLM_F_DUMP),
                Request::new(RouteNetlinkMessage::DelLink(del), 0),
            ])
            .unwrap();
        assert_eq!(answers[0].as_ref().unwrap_err().errno(), Some(ENODEV));
        let mut dumped = names(answers[1].as_ref().unwrap());
        dumped.sort();
        assert_eq!(dumped, ["fcnl0", "lo"]);
        assert!(answers[2].is_ok(), "{:?}", answers[2]);
        assert!(sock.link_by_name("fcnl0").unwrap().is_none());
        assert_eq!(
            names(
                &sock
                    .dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))
                    .unwrap()
            ),
            ["lo"]
        );
    })
    .join()
    .unwrap()
    .unwrap();
    drop(ns);
}
