//! The `kubernetes` Service's endpoints: every live API server (upstream's lease endpoint
//! reconciler). Each API server keeps a Lease `kube-system/apiserver-<id>` (label
//! `apiserver.kubernetes.io/identity: kube-apiserver`, 15 s, renewed every 5 s) naming the
//! address and port it serves on; every API server writes the `kubernetes` Endpoints and
//! EndpointSlice(s) from the live leases, so in-cluster clients (through ferro-proxy's rules
//! for the Service) reach any replica, and a dead one leaves them within the lease duration.
//! Each also deletes the leases of servers gone for longer than two lease durations (upstream's
//! apiserver lease garbage collector), so restarts leave no leases behind.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::api::Api;
use crate::resources;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_INTERVAL: Duration = Duration::from_secs(5);
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const ADDRESS_ANNOTATION: &str = "ferro.dev/apiserver-address";
pub const PORT_ANNOTATION: &str = "ferro.dev/apiserver-port";

/// One live API server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub port: u16,
    pub ip: IpAddr,
}

/// The API servers whose leases are live at `now`.
pub fn live_members(leases: &[Value], now: jiff::Timestamp) -> Vec<Member> {
    let mut out: Vec<Member> = leases
        .iter()
        .filter(|l| l.pointer("/metadata/labels").and_then(|m| m.get(IDENTITY_LABEL)).and_then(Value::as_str) == Some("kube-apiserver"))
        .filter(|l| l.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|l| {
            let renew: jiff::Timestamp = l.pointer("/spec/renewTime").and_then(Value::as_str)?.parse().ok()?;
            let secs = l.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64)?;
            let live = renew.as_second() + secs >= now.as_second();
            let a = l.pointer("/metadata/annotations")?;
            let ip: IpAddr = a.get(ADDRESS_ANNOTATION)?.as_str()?.parse().ok()?;
            let port: u16 = a.get(PORT_ANNOTATION)?.as_str()?.parse().ok()?;
            live.then_some(Member { port, ip })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The API server leases expired at `now` for longer than one more lease duration (a margin for
/// clock skew between replicas): their names and resourceVersions, for deletes guarded by the
/// version (a lease renewed in between stays).
pub fn stale_leases(leases: &[Value], now: jiff::Timestamp) -> Vec<(String, String)> {
    leases
        .iter()
        .filter(|l| l.pointer("/metadata/labels").and_then(|m| m.get(IDENTITY_LABEL)).and_then(Value::as_str) == Some("kube-apiserver"))
        .filter(|l| l.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|l| {
            let secs = l.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64)?;
            // a lease that was never renewed counts from its creation
            let renew: jiff::Timestamp = l
                .pointer("/spec/renewTime")
                .or_else(|| l.pointer("/metadata/creationTimestamp"))
                .and_then(Value::as_str)?
                .parse()
                .ok()?;
            let stale = renew.as_second() + 2 * secs < now.as_second();
            let name = l.pointer("/metadata/name").and_then(Value::as_str)?;
            let rv = l.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
            stale.then(|| (name.to_string(), rv.to_string()))
        })
        .collect()
}

/// The `kubernetes` Endpoints: one subset per port, its addresses sorted.
pub fn endpoints(members: &[Member]) -> Value {
    let mut by_port: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for m in members {
        by_port.entry(m.port).or_default().push(m.ip.to_string());
    }
    let subsets: Vec<Value> = by_port
        .into_iter()
        .map(|(port, ips)| {
            json!({"addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(), "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
        })
        .collect();
    let mut ep = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "kubernetes", "namespace": "default",
        "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}}});
    if !subsets.is_empty() {
        ep["subsets"] = json!(subsets);
    }
    ep
}

/// The `kubernetes` EndpointSlices: one per port and address family (`kubernetes` for the
/// first, `kubernetes-<port>[-ipv6]` for others).
pub fn slices(members: &[Member]) -> Vec<(String, Value)> {
    let mut groups: BTreeMap<(u16, bool), Vec<String>> = BTreeMap::new();
    for m in members {
        groups.entry((m.port, m.ip.is_ipv6())).or_default().push(m.ip.to_string());
    }
    groups
        .into_iter()
        .enumerate()
        .map(|(i, ((port, v6), ips))| {
            let name = if i == 0 { "kubernetes".to_string() } else { format!("kubernetes-{port}{}", if v6 { "-ipv6" } else { "" }) };
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
                "addressType": if v6 { "IPv6" } else { "IPv4" },
                "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            });
            (name, slice)
        })
        .collect()
}

/// Whether a stored object already says what `want` says (ignoring server-owned metadata).
fn same(stored: &Value, want: &Value, fields: &[&str]) -> bool {
    fields.iter().all(|f| stored.get(*f) == want.get(*f))
        && stored.pointer("/metadata/labels") == want.pointer("/metadata/labels")
}

/// Renews this server's lease and brings the endpoints in line with the live leases.
async fn reconcile(api: &Api, id: &str, ip: IpAddr, port: u16) -> Result<(), crate::error::ApiError> {
    let leases = resources::find("coordination.k8s.io", "v1", "leases").ok_or_else(|| crate::error::ApiError::internal("no leases"))?;
    let now = jiff::Timestamp::now();
    let micro = now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
    let name = format!("apiserver-{id}");
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-system", "labels": {IDENTITY_LABEL: "kube-apiserver"},
                     "annotations": {ADDRESS_ANNOTATION: ip.to_string(), PORT_ANNOTATION: port.to_string()}},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION.as_secs(), "renewTime": micro}});
    api.update(leases, Some("kube-system"), &name, lease, crate::api::Endpoint::Main, false).await?;
    let listing = api.store.list(&leases.prefix(Some("kube-system"))).await?;
    let all: Vec<Value> = listing.records.iter().filter_map(|r| r.json().ok()).collect();
    let members = live_members(&all, now);
    for (stale, rv) in stale_leases(&all, now) {
        let opts = crate::api::DeleteOptions { precondition_rv: Some(rv).filter(|v| !v.is_empty()), ..Default::default() };
        match api.delete(leases, Some("kube-system"), &stale, &opts).await {
            Ok(_) => tracing::info!(lease = %stale, "deleted the lease of an API server gone for two lease durations"),
            // another replica deleted it first, or the server came back and renewed it
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(lease = %stale, error = %e.message, "deleting a stale API server lease"),
        }
    }
    let endpoints_res = resources::find("", "v1", "endpoints").ok_or_else(|| crate::error::ApiError::internal("no endpoints"))?;
    let want = endpoints(&members);
    let current = api.store.get(&endpoints_res.key(Some("default"), "kubernetes")).await?.and_then(|r| r.json().ok());
    if !current.as_ref().is_some_and(|c| same(c, &want, &["subsets"])) {
        api.update(endpoints_res, Some("default"), "kubernetes", want, crate::api::Endpoint::Main, false).await?;
    }
    let slices_res = resources::find("discovery.k8s.io", "v1", "endpointslices").ok_or_else(|| crate::error::ApiError::internal("no endpointslices"))?;
    let wanted = slices(&members);
    for (n, s) in &wanted {
        let current = api.store.get(&slices_res.key(Some("default"), n)).await?.and_then(|r| r.json().ok());
        if !current.as_ref().is_some_and(|c| same(c, s, &["endpoints", "ports", "addressType"])) {
            api.update(slices_res, Some("default"), n, s.clone(), crate::api::Endpoint::Main, false).await?;
        }
    }
    // slices of ports or families no longer served
    let existing = api.store.list(&slices_res.prefix(Some("default"))).await?;
    for r in existing.records {
        let Ok(v) = r.json() else { continue };
        let n = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let ours = n == "kubernetes" || n.starts_with("kubernetes-");
        let of_service = v.pointer("/metadata/labels/kubernetes.io~1service-name").and_then(Value::as_str) == Some("kubernetes");
        if ours && of_service && !wanted.iter().any(|(w, _)| w == n) {
            let _ = api.delete(slices_res, Some("default"), n, &crate::api::DeleteOptions::default()).await;
        }
    }
    Ok(())
}

/// Writes this server's lease and the endpoints once (start fails if that fails), then keeps
/// them for the life of the server.
pub async fn start(api: Arc<Api>, ip: IpAddr, port: u16) -> Result<(), crate::error::ApiError> {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    reconcile(&api, &id, ip, port).await?;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RENEW_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = reconcile(&api, &id, ip, port).await {
                tracing::warn!(error = %e.message, "kubernetes Service endpoints: renewing this API server's lease or writing the endpoints failed; again in 5 s");
            }
        }
    });
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lease(ip: &str, port: u16, renew: &str) -> Value {
        json!({"metadata": {"labels": {IDENTITY_LABEL: "kube-apiserver"}, "annotations": {ADDRESS_ANNOTATION: ip, PORT_ANNOTATION: port.to_string()}},
               "spec": {"renewTime": renew, "leaseDurationSeconds": 15}})
    }

    #[test]
    fn live_leases_make_the_endpoints() {
        let now: jiff::Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        let leases = vec![
            lease("10.0.0.2", 6443, "2026-01-01T00:00:10.000000Z"),
            lease("10.0.0.1", 6443, "2026-01-01T00:00:19.000000Z"),
            lease("10.0.0.3", 6443, "2026-01-01T00:00:01.000000Z"), // expired
            lease("fd00::1", 6443, "2026-01-01T00:00:19.000000Z"),
            json!({"metadata": {"name": "some-other-lease"}, "spec": {"renewTime": "2026-01-01T00:00:19Z", "leaseDurationSeconds": 15}}),
        ];
        let m = live_members(&leases, now);
        assert_eq!(m.iter().map(|m| m.ip.to_string()).collect::<Vec<_>>(), ["10.0.0.1", "10.0.0.2", "fd00::1"]);
        let ep = endpoints(&m);
        assert_eq!(ep["subsets"][0]["addresses"], json!([{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "fd00::1"}]));
        let s = slices(&m);
        assert_eq!(s.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["kubernetes", "kubernetes-6443-ipv6"]);
        assert_eq!(s[0].1["endpoints"].as_array().unwrap().len(), 2);
        assert_eq!(s[1].1["addressType"], "IPv6");
        // nobody alive: no subsets, no slices
        assert!(endpoints(&[]).get("subsets").is_none());
        assert!(slices(&[]).is_empty());
    }

    #[test]
    fn leases_gone_for_two_durations_are_collected() {
        let now: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let named = |name: &str, renew: &str| {
            let mut l = lease("10.0.0.1", 6443, renew);
            l["metadata"]["name"] = json!(name);
            l["metadata"]["resourceVersion"] = json!("7");
            l
        };
        let leases = vec![
            named("apiserver-live", "2026-01-01T00:00:59.000000Z"),
            named("apiserver-expired", "2026-01-01T00:00:40.000000Z"), // expired 5 s ago: kept
            named("apiserver-gone", "2026-01-01T00:00:29.000000Z"),   // 31 s > 2 x 15 s
            json!({"metadata": {"name": "node-lease", "resourceVersion": "3"}, "spec": {"renewTime": "2020-01-01T00:00:00Z", "leaseDurationSeconds": 15}}),
        ];
        assert_eq!(stale_leases(&leases, now), vec![("apiserver-gone".to_string(), "7".to_string())]);
        // being deleted already: left alone
        let mut deleting = named("apiserver-gone", "2026-01-01T00:00:00.000000Z");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:50Z");
        assert!(stale_leases(&[deleting], now).is_empty());
    }
}
