//! The cost of verifying a reader's token, which every subscription pays once: HS256 (a shared
//! secret) and ES256 (a public key). The keys in `benches/keys/` are throwaway test keys.

use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use viewtape_server::auth::Auth;
use viewtape_server::config::AuthSection;

const ES256_PRIVATE: &[u8] = include_bytes!("keys/es256-private.pem");
const SECRET: &str = "bench-secret";

fn claims() -> serde_json::Value {
    let exp = viewtape_server::log::unix_ms_now() / 1000 + 3600;
    serde_json::json!({ "exp": exp, "aud": "viewtape", "views": ["prices", "orders.*"], "ingest": ["demo"] })
}

fn verify(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify_token");
    let section = AuthSection {
        audience: Some("viewtape".into()),
        ..AuthSection::default()
    };
    let hs = Auth::load(&section, Some(SECRET))
        .expect("load")
        .expect("on");
    let token = encode(
        &Header::default(),
        &claims(),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("token");
    group.bench_function("hs256", |b| b.iter(|| hs.verify(&token).expect("valid")));

    let public = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/keys/es256-public.pem");
    let es = Auth::load(
        &AuthSection {
            public_keys: Some(public.into()),
            ..section
        },
        None,
    )
    .expect("load")
    .expect("on");
    let token = encode(
        &Header::new(Algorithm::ES256),
        &claims(),
        &EncodingKey::from_ec_pem(ES256_PRIVATE).expect("key"),
    )
    .expect("token");
    group.bench_function("es256", |b| b.iter(|| es.verify(&token).expect("valid")));
    group.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
