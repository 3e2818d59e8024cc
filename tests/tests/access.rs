//! Access control against the real binary: tokens for readers and writers (HS256 from
//! `VIEWTAPE_JWT_SECRET`), 401 and 403 with JSON bodies, public views, the cookie a browser's
//! `EventSource` sends, `?access_token=` refused unless allowed, `GET /views` filtered, and a
//! stream that ends with `event: reauth` when its token expires — after which the client
//! resumes with a fresh token and its cursor, losing nothing.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{config_file, guest_wasm};
use viewtape_tests::token::hs256;
use viewtape_tests::{expect, http, Feed, Response, Server};

const SECRET: &str = "access-test-secret";

async fn start() -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let config = config_file(&format!(
        "[auth]\naudience = \"viewtape\"\npublic_views = [\"public\"]\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"notes\"\nwasm = {:?}\nviews = [\"public\"]\n",
        guest_wasm("misbehave").display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let server =
        Server::start_with_env(&["--config", &path], &[("VIEWTAPE_JWT_SECRET", SECRET)]).await?;
    Ok((server, config))
}

async fn get(server: &Server, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Response> {
    http::request(server.addr(), "GET", path, headers, b"").await
}

/// A refusal: the status, a JSON error, and `WWW-Authenticate: Bearer` on a 401.
fn refused(resp: &Response, status: u16, what: &str) -> anyhow::Result<()> {
    expect::json_error(resp, status).with_context(|| what.to_owned())?;
    if status == 401 {
        ensure!(
            resp.header("www-authenticate") == Some("Bearer"),
            "{what}: no WWW-Authenticate"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_reads_and_writes() -> anyhow::Result<()> {
    let (server, _config) = start().await?;
    let mut feed = Feed::new(&["ACME"]);
    let tick = feed.batch(1);
    let good = hs256(SECRET, 60, "viewtape", &["pri*"], &["demo"]);
    let bearer = |t: &str| format!("Bearer {t}");

    // Without a valid token: 401 on streams, state and ingest alike.
    let bad_tokens = [
        String::new(),
        "garbage".to_owned(),
        hs256(SECRET, -60, "viewtape", &["prices"], &["demo"]),
        hs256("another-secret", 60, "viewtape", &["prices"], &["demo"]),
        hs256(SECRET, 60, "elsewhere", &["prices"], &["demo"]),
    ];
    for bad in &bad_tokens {
        let auth = bearer(bad);
        let headers: Vec<(&str, &str)> = if bad.is_empty() {
            vec![]
        } else {
            vec![("Authorization", &auth)]
        };
        for path in ["/views/prices/events", "/views/prices"] {
            refused(&get(&server, path, &headers).await?, 401, path)?;
        }
        let resp = http::request(
            server.addr(),
            "POST",
            "/runtimes/demo/ingest",
            &headers,
            tick.as_bytes(),
        )
        .await?;
        refused(&resp, 401, "ingest")?;
    }
    refused(
        &get(&server, "/views/prices", &[("Authorization", "Basic abc")]).await?,
        401,
        "another scheme",
    )?;

    // A valid token: what it grants, and 403 for what it does not.
    let auth = bearer(&good);
    let with = [("Authorization", auth.as_str())];
    let resp = http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &with,
        tick.as_bytes(),
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    ensure!(get(&server, "/views/prices", &with).await?.status() == 200);
    let mut stream = server.sse("/views/prices/events", &with).await?;
    stream.until_synced(10).await?;
    let resp = http::request(
        server.addr(),
        "POST",
        "/runtimes/notes/ingest",
        &with,
        b"publish public k v\n",
    )
    .await?;
    refused(&resp, 403, "ingest into a runtime the token does not grant")?;
    let narrow = bearer(&hs256(SECRET, 60, "viewtape", &["orders.*"], &[]));
    refused(
        &get(&server, "/views/prices", &[("Authorization", &narrow)]).await?,
        403,
        "a view the token does not grant",
    )?;

    // Public views need no token; a bad token is still refused there.
    ensure!(get(&server, "/views/public", &[]).await?.status() == 200);
    refused(
        &get(
            &server,
            "/views/public",
            &[("Authorization", "Bearer garbage")],
        )
        .await?,
        401,
        "no fallback to anonymous",
    )?;

    // GET /views lists what the caller may read.
    let names = |resp: Response| -> anyhow::Result<Vec<String>> {
        let body = resp.json()?;
        Ok(body["views"]
            .as_array()
            .context("views")?
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect())
    };
    ensure!(names(get(&server, "/views", &[]).await?)? == ["public"]);
    ensure!(names(get(&server, "/views", &with).await?)? == ["prices", "public"]);

    // The cookie a browser's EventSource sends; ?access_token= only where allowed.
    let cookie = format!("theme=dark; viewtape_token={good}");
    let mut by_cookie = server
        .sse("/views/prices/events", &[("Cookie", &cookie)])
        .await?;
    by_cookie.until_synced(10).await?;
    refused(
        &get(&server, &format!("/views/prices?access_token={good}"), &[]).await?,
        401,
        "query token while not allowed",
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_with_reauth_at_expiry_and_resumes_with_a_fresh_token() -> anyhow::Result<()>
{
    let (server, _config) = start().await?;
    let writer = format!("Bearer {}", hs256(SECRET, 600, "viewtape", &[], &["demo"]));
    let mut feed = Feed::new(&["ACME"]);
    let ingest = |body: String| {
        let writer = writer.clone();
        let addr = server.addr();
        async move {
            let resp = http::request(
                addr,
                "POST",
                "/runtimes/demo/ingest",
                &[("Authorization", &writer)],
                body.as_bytes(),
            )
            .await?;
            ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
            anyhow::Ok(())
        }
    };
    ingest(feed.batch(2)).await?;
    let short = format!("Bearer {}", hs256(SECRET, 2, "viewtape", &["prices"], &[]));
    let mut stream = server
        .sse(
            "/views/prices/events?from=tape",
            &[("Authorization", &short)],
        )
        .await?;
    let mut last = None;
    for offset in 1..=2 {
        last = Some(expect::update(
            &stream.next_event().await?,
            offset,
            "ACME",
            offset,
        )?);
    }
    let last = last.context("a cursor")?;
    // The token runs out: a last `reauth` without an id, then the end of the response.
    let event = stream
        .next_within(Duration::from_secs(10))
        .await?
        .context("reauth before the end")?;
    ensure!(event.event == "reauth" && event.id.is_none(), "{event:?}");
    ensure!(
        stream.next_within(Duration::from_secs(5)).await?.is_none(),
        "the stream ends after reauth"
    );
    // Meanwhile more was published; a fresh token and the cursor resume with nothing lost.
    ingest(feed.batch(2)).await?;
    let fresh = format!("Bearer {}", hs256(SECRET, 60, "viewtape", &["prices"], &[]));
    let mut resumed = server
        .sse(
            "/views/prices/events",
            &[
                ("Authorization", &fresh),
                ("Last-Event-ID", &last.to_string()),
            ],
        )
        .await?;
    for offset in 3..=4 {
        expect::update(&resumed.next_event().await?, offset, "ACME", offset)?;
    }
    Ok(())
}
