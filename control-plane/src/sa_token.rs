//! ServiceAccount tokens: JWTs signed with the cluster's service-account key (ES256, P-256;
//! `sa.key` in the data dir, made at first start), as upstream's bound service account tokens
//! (the TokenRequest API): issuer, subject `system:serviceaccount:<ns>:<name>`, audiences,
//! expiry, and the `kubernetes.io` claim naming the service account and the object the token is
//! bound to (a Pod, with its Node, or a Secret). The API server checks on every use that the
//! service account and the bound object still exist with the uids the token names.
//!
//! Also the OIDC discovery documents (`/.well-known/openid-configuration`, `/openid/v1/jwks`)
//! that let anyone outside verify the tokens.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Upstream's default issuer (kubeadm's `--service-account-issuer`).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Upstream's rules for `--service-account-issuer`: not empty; a URL (anything with a `:`)
/// must be https without a query or fragment (its OIDC discovery documents live under it).
pub fn validate_issuer(issuer: &str) -> Result<String, String> {
    if issuer.is_empty() {
        return Err("--service-account-issuer: must not be empty".into());
    }
    if issuer.contains(':') {
        let rest = issuer
            .strip_prefix("https://")
            .ok_or_else(|| format!("--service-account-issuer {issuer:?}: an issuer URL must use the https scheme"))?;
        if rest.is_empty() || rest.contains('?') || rest.contains('#') {
            return Err(format!("--service-account-issuer {issuer:?}: an issuer URL needs a host and no query or fragment"));
        }
    }
    Ok(issuer.to_string())
}
/// The clock tokens are issued and checked with: the system's, or (tests only, the hidden
/// `--tokens-clock-file`) one that follows a file, so a test can see a token expire.
static CLOCK: std::sync::OnceLock<crate::controllers::clock::Clock> = std::sync::OnceLock::new();

/// Sets the tokens' clock (once, at start).
pub fn set_clock(clock: crate::controllers::clock::Clock) {
    let _ = CLOCK.set(clock);
}

/// Now, in seconds, by the tokens' clock.
pub fn now() -> i64 {
    CLOCK.get().map(|c| c.now()).unwrap_or_else(jiff::Timestamp::now).as_second()
}

/// The issuer of legacy (Secret-based) tokens.
pub const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

/// The claims of a legacy token.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LegacyClaims {
    pub iss: String,
    pub sub: String,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    pub namespace: String,
    #[serde(rename = "kubernetes.io/serviceaccount/secret.name")]
    pub secret: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.name")]
    pub account: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.uid")]
    pub account_uid: String,
}

/// TokenRequest's default and minimum `expirationSeconds`.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The token a pod's kube-api-access volume asks for (upstream's odd 3607: one hour and a bit,
/// so the kubelet's refresh at 80 % happens before the hour expires).
pub const POD_TOKEN_EXPIRATION_SECONDS: i64 = 3607;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("service account key {0}: {1}")]
    Key(String, String),
    #[error("{0}")]
    Invalid(String),
}

/// A reference in the `kubernetes.io` claim.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` private claim (upstream's names).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct KubernetesClaim {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pod: Option<Ref>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub secret: Option<Ref>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub node: Option<Ref>,
}

/// A token's claims.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
}

impl Claims {
    /// The user the token authenticates as (upstream's ServiceAccount authenticator).
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.kubernetes.namespace, self.kubernetes.serviceaccount.name)
    }

    pub fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{}", self.kubernetes.namespace),
            "system:authenticated".to_string(),
        ]
    }

    /// The user's extra attributes (upstream's `authentication.kubernetes.io/...` keys).
    pub fn extra(&self) -> Value {
        let mut extra = serde_json::Map::new();
        extra.insert("authentication.kubernetes.io/credential-id".into(), json!([format!("JTI={}", self.jti)]));
        if let Some(p) = &self.kubernetes.pod {
            extra.insert("authentication.kubernetes.io/pod-name".into(), json!([p.name]));
            extra.insert("authentication.kubernetes.io/pod-uid".into(), json!([p.uid]));
        }
        if let Some(n) = &self.kubernetes.node {
            extra.insert("authentication.kubernetes.io/node-name".into(), json!([n.name]));
            extra.insert("authentication.kubernetes.io/node-uid".into(), json!([n.uid]));
        }
        Value::Object(extra)
    }
}

/// The signing key and what is published of it.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    /// base64url(SHA-256(public key SubjectPublicKeyInfo DER)), as upstream's key id.
    pub kid: String,
    pub issuer: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("kid", &self.kid).field("issuer", &self.issuer).finish()
    }
}

impl SigningKey {
    /// Loads `sa.key` (PKCS#8 PEM, P-256) from `dir`, creating it at first start.
    pub fn load_or_create(dir: &Path, issuer: &str) -> Result<SigningKey, TokenError> {
        let path = dir.join("sa.key");
        let err = |e: String| TokenError::Key(path.display().to_string(), e);
        let pem = if path.exists() {
            std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?
        } else {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| err(e.to_string()))?;
            let pem = kp.serialize_pem();
            crate::pki::write_secret(&path, pem.as_bytes()).map_err(|e| err(e.to_string()))?;
            pem
        };
        SigningKey::from_pem(&pem, issuer).map_err(|e| err(e.to_string()))
    }

    pub fn from_pem(pem: &str, issuer: &str) -> Result<SigningKey, TokenError> {
        let kp = rcgen::KeyPair::from_pem(pem).map_err(|e| TokenError::Invalid(e.to_string()))?;
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &kp.serialize_der(), &rng)
            .map_err(|e| TokenError::Invalid(format!("not a P-256 key: {e}")))?;
        let spki = rcgen::PublicKeyData::subject_public_key_info(&kp);
        let kid = B64.encode(ring::digest::digest(&ring::digest::SHA256, &spki));
        Ok(SigningKey { pair, kid, issuer: issuer.to_string() })
    }

    /// A signed token for `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        self.sign_value(&serde_json::to_value(claims).map_err(|e| TokenError::Invalid(e.to_string()))?)
    }

    fn sign_value(&self, claims: &Value) -> Result<String, TokenError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let body = serde_json::to_vec(claims).map_err(|e| TokenError::Invalid(e.to_string()))?;
        let signing_input = format!("{}.{}", B64.encode(header.to_string()), B64.encode(body));
        let rng = ring::rand::SystemRandom::new();
        let sig = self.pair.sign(&rng, signing_input.as_bytes()).map_err(|_| TokenError::Invalid("signing failed".into()))?;
        Ok(format!("{signing_input}.{}", B64.encode(sig.as_ref())))
    }

    /// The claims of a token this key signed, checked for signature, issuer, time (60 s of
    /// leeway, as upstream) and, when `audiences` is not empty, an audience among them.
    pub fn verify(&self, token: &str, now: i64, audiences: &[String]) -> Result<Claims, TokenError> {
        let bad = |why: &str| TokenError::Invalid(why.to_string());
        let body = self.verified_body(token)?;
        let claims: Claims = serde_json::from_slice(&body).map_err(|e| TokenError::Invalid(format!("malformed claims: {e}")))?;
        if claims.iss != self.issuer {
            return Err(bad("invalid issuer"));
        }
        const LEEWAY: i64 = 60;
        if now > claims.exp + LEEWAY {
            return Err(bad("token has expired"));
        }
        if now + LEEWAY < claims.nbf {
            return Err(bad("token used before issued"));
        }
        if !audiences.is_empty() && !claims.aud.iter().any(|a| audiences.contains(a)) {
            return Err(bad("token audiences are invalid"));
        }
        Ok(claims)
    }

    /// The claims' bytes of a JWT whose ES256 signature by this key is valid.
    fn verified_body(&self, token: &str) -> Result<Vec<u8>, TokenError> {
        let bad = |why: &str| TokenError::Invalid(why.to_string());
        let mut parts = token.split('.');
        let (Some(h), Some(b), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad("not a JWT"));
        };
        let header: Value = serde_json::from_slice(&B64.decode(h).map_err(|_| bad("malformed header"))?).map_err(|_| bad("malformed header"))?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return Err(bad("unexpected signing algorithm"));
        }
        let sig = B64.decode(s).map_err(|_| bad("malformed signature"))?;
        let public = signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, self.pair.public_key().as_ref());
        public.verify(format!("{h}.{b}").as_bytes(), &sig).map_err(|_| bad("invalid signature"))?;
        B64.decode(b).map_err(|_| bad("malformed claims"))
    }

    /// A legacy (Secret-based, non-expiring) token, as upstream's tokens controller signs it:
    /// issuer `kubernetes/serviceaccount` and the `kubernetes.io/serviceaccount/*` claims.
    pub fn sign_legacy(&self, namespace: &str, secret: &str, account: &str, account_uid: &str) -> Result<String, TokenError> {
        let claims = json!({
            "iss": LEGACY_ISSUER,
            "sub": format!("system:serviceaccount:{namespace}:{account}"),
            "kubernetes.io/serviceaccount/namespace": namespace,
            "kubernetes.io/serviceaccount/secret.name": secret,
            "kubernetes.io/serviceaccount/service-account.name": account,
            "kubernetes.io/serviceaccount/service-account.uid": account_uid,
        });
        self.sign_value(&claims)
    }

    /// The claims of a legacy token this key signed (signature and issuer checked; the caller
    /// checks that its Secret and account still exist).
    pub fn verify_legacy(&self, token: &str) -> Result<LegacyClaims, TokenError> {
        let body = self.verified_body(token)?;
        let claims: LegacyClaims = serde_json::from_slice(&body).map_err(|e| TokenError::Invalid(format!("malformed claims: {e}")))?;
        if claims.iss != LEGACY_ISSUER {
            return Err(TokenError::Invalid("invalid issuer".into()));
        }
        Ok(claims)
    }

    /// `/.well-known/openid-configuration` (upstream's fields).
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer.trim_end_matches('/')),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// `/openid/v1/jwks`: the public key as a JWK.
    pub fn jwks(&self) -> Value {
        // the uncompressed point: 0x04 || X || Y
        let point = self.pair.public_key().as_ref();
        let (x, y) = point[1..].split_at(32);
        json!({"keys": [{"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256", "x": B64.encode(x), "y": B64.encode(y)}]})
    }
}

/// A random token id (`jti`).
pub fn new_jti() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn legacy_tokens_round_trip_and_are_not_bound_tokens() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let k = SigningKey::from_pem(&kp.serialize_pem(), DEFAULT_ISSUER).unwrap();
        let t = k.sign_legacy("ns", "app-token", "app", "u1").unwrap();
        let c = k.verify_legacy(&t).unwrap();
        assert_eq!((c.namespace.as_str(), c.secret.as_str(), c.account.as_str(), c.account_uid.as_str()), ("ns", "app-token", "app", "u1"));
        assert_eq!(c.sub, "system:serviceaccount:ns:app");
        assert!(k.verify(&t, 0, &[]).is_err(), "a legacy token is no bound token");
        let other = SigningKey::from_pem(&rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap().serialize_pem(), DEFAULT_ISSUER).unwrap();
        assert!(other.verify_legacy(&t).is_err(), "another key's signature");
    }

    #[test]
    fn issuers_as_upstream_accepts_them() {
        assert!(validate_issuer(DEFAULT_ISSUER).is_ok());
        assert!(validate_issuer("ferro").is_ok(), "not a URL: any string");
        assert!(validate_issuer("").is_err());
        assert!(validate_issuer("http://x.example").unwrap_err().contains("https"));
        assert!(validate_issuer("https://x.example/?a=b").is_err());
    }

    fn key() -> SigningKey {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        SigningKey::from_pem(&kp.serialize_pem(), DEFAULT_ISSUER).unwrap()
    }

    fn claims(now: i64) -> Claims {
        Claims {
            iss: DEFAULT_ISSUER.into(),
            sub: "system:serviceaccount:ns:app".into(),
            aud: vec![DEFAULT_ISSUER.into()],
            exp: now + 3600,
            iat: now,
            nbf: now,
            jti: "j1".into(),
            kubernetes: KubernetesClaim {
                namespace: "ns".into(),
                serviceaccount: Ref { name: "app".into(), uid: "sa-uid".into() },
                pod: Some(Ref { name: "p".into(), uid: "pod-uid".into() }),
                secret: None,
                node: Some(Ref { name: "n1".into(), uid: "node-uid".into() }),
            },
        }
    }

    #[test]
    fn a_signed_token_verifies_and_names_its_user() {
        let k = key();
        let t = k.sign(&claims(1000)).unwrap();
        let c = k.verify(&t, 1000, &[DEFAULT_ISSUER.into()]).unwrap();
        assert_eq!(c, claims(1000));
        assert_eq!(c.username(), "system:serviceaccount:ns:app");
        assert_eq!(c.groups(), ["system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"]);
        assert_eq!(c.extra()["authentication.kubernetes.io/pod-name"], json!(["p"]));
        // the payload carries upstream's claim names
        let body: Value = serde_json::from_slice(&B64.decode(t.split('.').nth(1).unwrap()).unwrap()).unwrap();
        assert_eq!(body["kubernetes.io"]["serviceaccount"]["name"], "app");
        assert_eq!(body["sub"], "system:serviceaccount:ns:app");
    }

    #[test]
    fn tampered_expired_foreign_or_misaddressed_tokens_fail() {
        let k = key();
        let t = k.sign(&claims(1000)).unwrap();
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        let mut c = claims(1000);
        c.kubernetes.namespace = "kube-system".into();
        parts[1] = B64.encode(serde_json::to_vec(&c).unwrap());
        assert_eq!(k.verify(&parts.join("."), 1000, &[]).unwrap_err().to_string(), "invalid signature");
        assert_eq!(k.verify(&t, 1000 + 3600 + 61, &[]).unwrap_err().to_string(), "token has expired");
        assert!(k.verify(&t, 1000 + 3600 + 59, &[]).is_ok(), "60 s of leeway");
        assert_eq!(k.verify(&t, 1000, &["https://other".into()]).unwrap_err().to_string(), "token audiences are invalid");
        assert_eq!(key().verify(&t, 1000, &[]).unwrap_err().to_string(), "invalid signature");
        assert_eq!(k.verify("abc", 1000, &[]).unwrap_err().to_string(), "not a JWT");
    }

    #[test]
    fn the_discovery_documents_publish_the_key() {
        let k = key();
        let cfg = k.openid_configuration();
        assert_eq!(cfg["jwks_uri"], "https://kubernetes.default.svc.cluster.local/openid/v1/jwks");
        let jwk = &k.jwks()["keys"][0];
        assert_eq!(jwk["kid"], k.kid.as_str());
        // the JWK's point is the key that verifies
        let x = B64.decode(jwk["x"].as_str().unwrap()).unwrap();
        let y = B64.decode(jwk["y"].as_str().unwrap()).unwrap();
        let point: Vec<u8> = [vec![4u8], x, y].concat();
        let t = k.sign(&claims(5)).unwrap();
        let (input, sig) = t.rsplit_once('.').unwrap();
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
            .verify(input.as_bytes(), &B64.decode(sig).unwrap())
            .unwrap();
    }
}
