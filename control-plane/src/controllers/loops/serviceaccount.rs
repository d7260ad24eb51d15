//! ServiceAccount controller: every active namespace has a `default` service account.

use std::sync::Arc;

use ferro_runtime::{spawn_resync, spawn_workers, Change, Next, WorkQueue};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt as _};

use crate::controllers::manager::{Informers, Options};
use crate::controllers::{is_conflict, Error};

pub fn start(inf: &Arc<Informers>, opts: &Options) {
    let queue: WorkQueue<String> = WorkQueue::new();
    let namespaces = inf.namespaces();
    let accounts = inf.service_accounts();
    {
        let q = queue.clone();
        namespaces.on_change(move |c| {
            if let Change::Applied { new, .. } = c {
                q.add(new.name_any());
            }
        });
    }
    {
        let q = queue.clone();
        accounts.on_change(move |c| {
            if let Change::Deleted(sa) = c {
                if sa.name_any() == "default" {
                    q.add(sa.namespace().unwrap_or_default());
                }
            }
        });
    }
    {
        let ns = namespaces.clone();
        spawn_resync(queue.clone(), opts.resync, move || ns.list().iter().map(|n| n.name_any()).collect());
    }
    let client = inf.client();
    spawn_workers("serviceaccount", queue, 1, move |ns: String| {
        let (client, namespaces, accounts) = (client.clone(), namespaces.clone(), accounts.clone());
        async move {
            accounts.wait_synced().await;
            let Some(n) = namespaces.get(None, &ns) else { return Ok(Next::Done) };
            if n.metadata.deletion_timestamp.is_some() || accounts.get(Some(&ns), "default").is_some() {
                return Ok(Next::Done);
            }
            let sa = ServiceAccount {
                metadata: ObjectMeta { name: Some("default".into()), ..Default::default() },
                ..Default::default()
            };
            match Api::<ServiceAccount>::namespaced(client, &ns).create(&PostParams::default(), &sa).await {
                Ok(_) => Ok(Next::Done),
                Err(e) if is_conflict(&e) => Ok(Next::Done),
                // a namespace being deleted refuses new objects
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(Next::Done),
                Err(e) => Err(Error::from(e)),
            }
        }
    });
}
