//! The cost of verifying a reader's token: HS256 (a shared secret) and ES256 (a public key), a
//! token seen for the first time (each iteration takes the next of 20,000 distinct tokens, more
//! than the server remembers), and a token seen before (remembered until its `exp`). The keys in
//! `benches/keys/` are throwaway test keys.

use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use viewtape_server::Auth;
use viewtape_server::AuthSection;

const ES256_PRIVATE: &[u8] = include_bytes!("keys/es256-private.pem");
const SECRET: &str = "bench-secret";

/// Distinct tokens: more than the server remembers.
const DISTINCT: usize = 20_000;

fn claims(n: usize) -> serde_json::Value {
    let exp = viewtape_server::unix_ms_now() / 1000 + 3600;
    serde_json::json!({ "exp": exp, "aud": "viewtape", "views": ["prices", "orders.*"], "ingest": ["demo"], "jti": n })
}

/// Verifies the next token of `tokens` per iteration, then one token over and over.
fn bench(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    auth: &Auth,
    tokens: &[String],
) {
    let mut next = 0;
    c.bench_function(format!("{name}_first_sight"), |b| {
        b.iter(|| {
            next = (next + 1) % tokens.len();
            auth.verify(&tokens[next]).expect("valid")
        })
    });
    c.bench_function(format!("{name}_seen_before"), |b| {
        b.iter(|| auth.verify(&tokens[0]).expect("valid"))
    });
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
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    let tokens: Vec<String> = (0..DISTINCT)
        .map(|n| encode(&Header::default(), &claims(n), &key).expect("token"))
        .collect();
    bench(&mut group, "hs256", &hs, &tokens);

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
    let key = EncodingKey::from_ec_pem(ES256_PRIVATE).expect("key");
    let tokens: Vec<String> = (0..DISTINCT)
        .map(|n| encode(&Header::new(Algorithm::ES256), &claims(n), &key).expect("token"))
        .collect();
    bench(&mut group, "es256", &es, &tokens);
    group.finish();
}

criterion_group!(benches, verify);
criterion_main!(benches);
