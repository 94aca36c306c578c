//! The `oidc` identity provider against a JWKS this test generates: RS256, ES256 and EdDSA
//! accepted; `alg: none`, HS256 signed with the public key, wrong issuer/audience, expired,
//! not-yet-valid, tampered and unknown-kid tokens refused; key rotation picked up.

use crate::common::{assert_error, TestApp};
use base64::Engine;
use hearth_server::Service;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::{EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "hearth-test";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A signing key of the test identity provider and its public JWK.
struct TestKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
    /// PEM of the public key (RSA only), for the HS256-with-public-key attack.
    public_pem: Option<String>,
}

fn rsa_key(kid: &str) -> TestKey {
    let key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048).unwrap();
    let der = key.to_pkcs1_der().unwrap();
    let public = key.to_public_key();
    TestKey {
        kid: kid.into(),
        alg: Algorithm::RS256,
        encoding: EncodingKey::from_rsa_der(der.as_bytes()),
        jwk: json!({ "kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
                     "n": B64.encode(public.n().to_bytes_be()), "e": B64.encode(public.e().to_bytes_be()) }),
        public_pem: Some(public.to_public_key_pem(LineEnding::LF).unwrap()),
    }
}

fn ec_key(kid: &str) -> TestKey {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    TestKey {
        kid: kid.into(),
        alg: Algorithm::ES256,
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({ "kty": "EC", "kid": kid, "alg": "ES256", "crv": "P-256",
                     "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65]) }),
        public_pem: None,
    }
}

fn ed_key(kid: &str) -> TestKey {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    TestKey {
        kid: kid.into(),
        alg: Algorithm::EdDSA,
        encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({ "kty": "OKP", "kid": kid, "alg": "EdDSA", "crv": "Ed25519", "x": B64.encode(pair.public_key().as_ref()) }),
        public_pem: None,
    }
}

fn jwks(keys: &[&TestKey]) -> String {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() }).to_string()
}

fn claims(sub: &str) -> Value {
    let now = chrono::Utc::now().timestamp();
    json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "nbf": now - 5, "exp": now + 600, "marketing": true })
}

fn sign(key: &TestKey, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.clone());
    jsonwebtoken::encode(&header, claims, &key.encoding).unwrap()
}

struct Fixture {
    app: TestApp,
    jwks_path: PathBuf,
    _dir: tempfile::TempDir,
}

async fn oidc_app(keys: &[&TestKey]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, jwks(keys)).unwrap();
    let path = jwks_path.clone();
    let app = TestApp::builder()
        .configure(move |c| {
            c.auth.identity_provider = Some("oidc".into());
            c.auth.oidc.issuer = Some(ISSUER.into());
            c.auth.oidc.audience = Some(AUDIENCE.into());
            c.auth.oidc.jwks_file = Some(path);
            c.auth.oidc.refetch_min_interval_secs = Some(0);
            c.auth.oidc.leeway_secs = Some(0);
        })
        .spawn()
        .await;
    Fixture {
        app,
        jwks_path,
        _dir: dir,
    }
}

async fn sign_in(app: &TestApp, user: &str, idp_token: &str) -> (StatusCode, Value) {
    app.post(
        Service::Auth,
        "/token",
        json!({ "userId": user, "idpToken": idp_token }),
    )
    .await
}

async fn assert_refused(app: &TestApp, user: &str, idp_token: &str, why: &str) {
    let (status, body) = sign_in(app, user, idp_token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}: {body}");
    assert_error(&body, "InvalidCredentials");
}

#[tokio::test]
async fn rs256_es256_and_eddsa_id_tokens_sign_in() {
    let (rsa, ec, ed) = (rsa_key("rsa-1"), ec_key("ec-1"), ed_key("ed-1"));
    let f = oidc_app(&[&rsa, &ec, &ed]).await;
    for key in [&rsa, &ec, &ed] {
        let (status, body) = sign_in(&f.app, "wes", &sign(key, &claims("wes"))).await;
        assert_eq!(status, StatusCode::OK, "{:?}: {body}", key.alg);
        let token = body["serviceToken"].as_str().unwrap();
        let (_, v) = f
            .app
            .post(Service::Auth, "/validate", json!({ "serviceToken": token }))
            .await;
        assert_eq!(v["userId"], "wes");
        assert_eq!(v["isMarketing"], true, "marketing claim carried over");
    }
}

#[tokio::test]
async fn attacks_on_the_id_token_are_refused() {
    let rsa = rsa_key("rsa-1");
    let f = oidc_app(&[&rsa]).await;
    let good = sign(&rsa, &claims("xena"));
    let parts: Vec<&str> = good.split('.').collect();

    let none = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","kid":"rsa-1"}"#),
        parts[1]
    );
    assert_refused(&f.app, "xena", &none, "alg none").await;

    // The classic confusion: HS256 keyed with the RSA public key the verifier knows.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("rsa-1".into());
    let pem = rsa.public_pem.as_ref().unwrap();
    let hs = jsonwebtoken::encode(
        &header,
        &claims("xena"),
        &EncodingKey::from_secret(pem.as_bytes()),
    )
    .unwrap();
    assert_refused(&f.app, "xena", &hs, "HS256 with the public key").await;

    let mut c = claims("xena");
    c["iss"] = json!("https://evil.test");
    assert_refused(&f.app, "xena", &sign(&rsa, &c), "wrong issuer").await;
    let mut c = claims("xena");
    c["aud"] = json!("someone-else");
    assert_refused(&f.app, "xena", &sign(&rsa, &c), "wrong audience").await;
    let mut c = claims("xena");
    c["exp"] = json!(chrono::Utc::now().timestamp() - 60);
    assert_refused(&f.app, "xena", &sign(&rsa, &c), "expired").await;
    let mut c = claims("xena");
    c["nbf"] = json!(chrono::Utc::now().timestamp() + 600);
    assert_refused(&f.app, "xena", &sign(&rsa, &c), "not yet valid").await;

    let mut payload: Value = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
    payload["sub"] = json!("root");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(payload.to_string()),
        parts[2]
    );
    assert_refused(&f.app, "root", &tampered, "tampered payload").await;

    let stranger = rsa_key("rsa-unknown");
    assert_refused(
        &f.app,
        "xena",
        &sign(&stranger, &claims("xena")),
        "unknown kid",
    )
    .await;
    // A known kid but a different key's signature.
    let mut impostor = rsa_key("rsa-1");
    impostor.kid = "rsa-1".into();
    assert_refused(
        &f.app,
        "xena",
        &sign(&impostor, &claims("xena")),
        "wrong key for kid",
    )
    .await;

    assert_eq!(
        sign_in(&f.app, "xena", &good).await.0,
        StatusCode::OK,
        "the genuine token still works"
    );
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_by_refetching_on_unknown_kid() {
    let (old, new) = (ec_key("2024"), ed_key("2025"));
    let f = oidc_app(&[&old]).await;
    assert_eq!(
        sign_in(&f.app, "yuri", &sign(&old, &claims("yuri")))
            .await
            .0,
        StatusCode::OK
    );
    assert_refused(
        &f.app,
        "yuri",
        &sign(&new, &claims("yuri")),
        "not published yet",
    )
    .await;
    std::fs::write(&f.jwks_path, jwks(&[&old, &new])).unwrap();
    let (status, body) = sign_in(&f.app, "yuri", &sign(&new, &claims("yuri"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn jwks_from_a_url_is_cached_between_sign_ins() {
    let key = rsa_key("url-1");
    let body = jwks(&[&key]);
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let router = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let app = TestApp::builder()
        .configure(move |c| {
            c.auth.identity_provider = Some("oidc".into());
            c.auth.oidc.issuer = Some(ISSUER.into());
            c.auth.oidc.audience = Some(AUDIENCE.into());
            c.auth.oidc.jwks_url = Some(url);
        })
        .spawn()
        .await;
    for _ in 0..3 {
        assert_eq!(
            sign_in(&app, "zoe", &sign(&key, &claims("zoe"))).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "keys fetched once, then served from the cache"
    );
}
