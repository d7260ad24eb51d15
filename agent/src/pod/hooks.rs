//! Lifecycle hooks (postStart, preStop): exec, httpGet and sleep handlers. tcpSocket is
//! deprecated as a lifecycle handler and accepted as a no-op, as upstream does.

use std::time::Duration;

use k8s_openapi::api::core::v1::LifecycleHandler;

use super::probe::{exec_command, http_get, Exec, Target, LIFECYCLE_USER_AGENT};

/// Runs one lifecycle handler within `timeout`; Err(message) when it failed. An httpGet hook
/// fails only when the request does (upstream ignores the status code).
pub async fn run_handler(handler: &LifecycleHandler, target: &Target, exec: &dyn Exec, timeout: Duration) -> Result<(), String> {
    if let Some(e) = &handler.exec {
        let cmd = e.command.clone().unwrap_or_default();
        match exec_command(e, target, exec, timeout).await? {
            (0, _) => Ok(()),
            (code, out) => Err(format!("command {cmd:?} exited with {code}: {}", out.trim_end())),
        }
    } else if let Some(h) = &handler.http_get {
        match tokio::time::timeout(timeout, http_get(h, target, LIFECYCLE_USER_AGENT)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("http lifecycle hook timed out after {timeout:?}")),
        }
    } else if let Some(s) = &handler.sleep {
        let want = Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0));
        if want > timeout {
            tokio::time::sleep(timeout).await;
            return Err("container terminated before sleep hook finished".to_string());
        }
        tokio::time::sleep(want).await;
        Ok(())
    } else if handler.tcp_socket.is_some() {
        Ok(())
    } else {
        Err("lifecycle handler has no action".to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pod::probe::tests::{http_server, FakeExec};
    use http::header::USER_AGENT;

    fn handler(v: serde_json::Value) -> LifecycleHandler {
        serde_json::from_value(v).unwrap()
    }

    fn local() -> Target {
        Target { pod_ip: Some("127.0.0.1".to_string()), container_id: "c1".to_string(), ports: Vec::new() }
    }

    #[tokio::test(start_paused = true)]
    async fn exec_hooks() {
        let exec = FakeExec::new(|cmd| match cmd[0].as_str() {
            "ok" => Some(0),
            "bad" => Some(2),
            _ => None,
        });
        let t = local();
        let secs = Duration::from_secs(30);
        let h = |cmd: &str| handler(serde_json::json!({"exec": {"command": [cmd]}}));
        assert_eq!(run_handler(&h("ok"), &t, exec.as_ref(), secs).await, Ok(()));
        let e = run_handler(&h("bad"), &t, exec.as_ref(), secs).await.unwrap_err();
        assert!(e.contains("exited with 2") && e.contains("output of bad"), "{e}");
        let start = tokio::time::Instant::now();
        let e = run_handler(&h("hang"), &t, exec.as_ref(), secs).await.unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        assert_eq!(start.elapsed(), secs);
        assert_eq!(exec.calls("ok"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_tcp_and_empty_hooks() {
        let exec = FakeExec::new(|_| Some(0));
        let t = local();
        let start = tokio::time::Instant::now();
        let sleep = handler(serde_json::json!({"sleep": {"seconds": 5}}));
        assert_eq!(run_handler(&sleep, &t, exec.as_ref(), Duration::from_secs(30)).await, Ok(()));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert!(run_handler(&sleep, &t, exec.as_ref(), Duration::from_secs(2)).await.is_err(), "cut short by the timeout");
        let tcp = handler(serde_json::json!({"tcpSocket": {"port": 1}}));
        assert_eq!(run_handler(&tcp, &t, exec.as_ref(), Duration::from_secs(1)).await, Ok(()));
        assert!(run_handler(&handler(serde_json::json!({})), &t, exec.as_ref(), Duration::from_secs(1)).await.is_err());
    }

    #[tokio::test]
    async fn http_hooks() {
        let (port, seen) = http_server(false).await;
        let exec = FakeExec::new(|_| Some(0));
        let t = local();
        let h = |path: &str| handler(serde_json::json!({"httpGet": {"port": port, "path": path}}));
        assert_eq!(run_handler(&h("/ok"), &t, exec.as_ref(), Duration::from_secs(5)).await, Ok(()));
        assert_eq!(seen.lock().unwrap().last().unwrap().1[USER_AGENT], "kube-lifecycle/1.33");
        // Upstream ignores the status code of a lifecycle hook's answer.
        assert_eq!(run_handler(&h("/fail"), &t, exec.as_ref(), Duration::from_secs(5)).await, Ok(()));
        let e = run_handler(&h("/slow"), &t, exec.as_ref(), Duration::from_millis(300)).await.unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        let closed = handler(serde_json::json!({"httpGet": {"port": port, "host": "127.0.0.1", "path": "/"}}));
        let no_server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let closed = LifecycleHandler {
            http_get: closed.http_get.map(|mut g| {
                g.port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(no_server));
                g
            }),
            ..closed
        };
        assert!(run_handler(&closed, &t, exec.as_ref(), Duration::from_secs(5)).await.is_err());
    }
}
