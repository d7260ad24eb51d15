//! Rotation of the node's client certificate (upstream's kubelet client certificate manager,
//! `rotateCertificates`): at a random point between 70 % and 90 % of the certificate's
//! validity the agent makes a new key and a CertificateSigningRequest for its own node name,
//! authenticated with the current certificate (the control plane approves it through
//! `certificatesigningrequests/selfnodeclient`), keeps the issued pair next to the old ones and
//! repoints `kubelet-client-current.pem` at it, then builds its API client again so new
//! requests use it, without a restart. Failures are retried with backoff while the old
//! certificate stays in use; once it has expired with no new one, the agent joins again with
//! its bootstrap kubeconfig when it has one.
//!
//! `plan.rs` decides (when, what, how long to wait, file names); `store.rs` keeps the pairs;
//! `client.rs` is the replaceable client; `rotate.rs` is the loop over a narrow [`rotate::Rotation`]
//! trait, real against the API and recorded in the tests.

pub mod client;
pub mod plan;
pub mod rotate;
pub mod store;
