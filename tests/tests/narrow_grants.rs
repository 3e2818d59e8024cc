//! Narrowed grants against the real binary: a token whose `views` names `prices?prefix=EU-` (or
//! `prices?keys=…`) reads only those keys of `prices`, by every route — the state, the stream
//! from the state, from the tape, from a cursor (one a full stream gave, by `Last-Event-ID` or
//! `?cursor=`), through resets and `?until=head`, and what `GET /views` counts; a read narrowed
//! within the grant is served, one reaching outside it is a `403`; several grants of one view
//! join or are refused; a narrowed public view; and a stream ended by `reauth` resumes under a
//! narrower token only within its grant.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use viewtape_tests::server::{config_file, guest_wasm};
use viewtape_tests::token::hs256;
use viewtape_tests::{expect, http, EventStream, Feed, Response, Server, SseEvent};

const SECRET: &str = "narrow-grants-test-secret";

/// Ticks cycle over these: seq 1 is EU-1, 2 EU-2, 3 US-1, 4 US-2, 5 EU-1, …
const SYMBOLS: [&str; 4] = ["EU-1", "EU-2", "US-1", "US-2"];

/// A server with `prices` (the ticker) behind tokens, and `public` (the misbehave fixture)
/// readable without one where its keys start with `open-`.
async fn start() -> anyhow::Result<(Server, tempfile::NamedTempFile)> {
    let config = config_file(&format!(
        "[auth]\naudience = \"viewtape\"\npublic_views = [\"public?prefix=open-\"]\n\n\
         [[runtime]]\nname = \"demo\"\nwasm = \"builtin:ticker\"\nviews = [\"prices\"]\n\n\
         [[runtime]]\nname = \"notes\"\nwasm = {:?}\nviews = [\"public\"]\n",
        guest_wasm("misbehave").display().to_string()
    ))?;
    let path = config.path().display().to_string();
    let server =
        Server::start_with_env(&["--config", &path], &[("VIEWTAPE_JWT_SECRET", SECRET)]).await?;
    Ok((server, config))
}

/// `Authorization: Bearer` for a token granting `views` for a minute.
fn bearer(views: &[&str]) -> String {
    format!("Bearer {}", hs256(SECRET, 60, "viewtape", views, &[]))
}

async fn get(server: &Server, path: &str, auth: &str) -> anyhow::Result<Response> {
    http::request(server.addr(), "GET", path, &[("Authorization", auth)], b"").await
}

async fn ingest(server: &Server, runtime: &str, body: &str) -> anyhow::Result<()> {
    let writer = format!(
        "Bearer {}",
        hs256(SECRET, 600, "viewtape", &[], &["demo", "notes"])
    );
    let resp = http::request(
        server.addr(),
        "POST",
        &format!("/runtimes/{runtime}/ingest"),
        &[("Authorization", &writer)],
        body.as_bytes(),
    )
    .await?;
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    Ok(())
}

/// The keys of a `GET /views/{view}` answer, which must be a 200.
fn state_keys(resp: &Response) -> anyhow::Result<BTreeSet<String>> {
    ensure!(resp.status() == 200, "{} {}", resp.status(), resp.text());
    let state = resp.json()?;
    Ok(state["entries"]
        .as_object()
        .with_context(|| format!("entries in {state}"))?
        .keys()
        .cloned()
        .collect())
}

fn key_of(event: &SseEvent) -> anyhow::Result<String> {
    Ok(event.json()?["key"].as_str().context("key")?.to_owned())
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// The keys of a state transfer, read up to its `synced`.
async fn synced_keys(stream: &mut EventStream) -> anyhow::Result<BTreeSet<String>> {
    let (states, _) = stream.until_synced(10).await?;
    states.iter().map(key_of).collect()
}

/// What `GET /views` says of `view` to `auth`; an error if it is not listed.
async fn listed(server: &Server, auth: &str, view: &str) -> anyhow::Result<serde_json::Value> {
    let listed = get(server, "/views", auth).await?.json()?;
    listed["views"]
        .as_array()
        .context("views")?
        .iter()
        .find(|v| v["name"] == view)
        .cloned()
        .with_context(|| format!("{view} listed: {listed}"))
}

/// A `403 forbidden` whose message says what the grant is.
fn forbidden(resp: &Response, grant: &str, what: &str) -> anyhow::Result<()> {
    let error = expect::json_error(resp, 403).with_context(|| what.to_owned())?;
    ensure!(error["error"] == "forbidden", "{what}: {error}");
    let message = error["message"].as_str().unwrap_or_default();
    ensure!(message.contains(grant), "{what}: {message}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_grant_cannot_read_other_keys_by_any_route() -> anyhow::Result<()> {
    let (server, _config) = start().await?;
    let mut feed = Feed::new(&SYMBOLS);
    ingest(&server, "demo", &feed.batch(8)).await?;
    let eu = bearer(&["prices?prefix=EU-"]);
    let full = bearer(&["prices"]);
    let eu_keys = set(&["EU-1", "EU-2"]);

    // State: the grant's keys; narrowed within it, those; reaching outside it, 403.
    ensure!(state_keys(&get(&server, "/views/prices", &full).await?)?.len() == 4);
    ensure!(state_keys(&get(&server, "/views/prices", &eu).await?)? == eu_keys);
    for (query, keys) in [
        ("prefix=EU-", &["EU-1", "EU-2"][..]),
        ("prefix=EU-1", &["EU-1"]),
        ("keys=EU-2", &["EU-2"]),
        ("keys=EU-1,EU-2,EU-9", &["EU-1", "EU-2"]),
    ] {
        let resp = get(&server, &format!("/views/prices?{query}"), &eu).await?;
        ensure!(state_keys(&resp)? == set(keys), "{query}");
    }
    let escapes = [
        "prefix=US-",
        "prefix=E",
        "prefix=eu-",
        "keys=US-1",
        "keys=EU-1,US-1",
        "keys=EU",
    ];
    for query in escapes {
        for path in ["/views/prices", "/views/prices/events"] {
            let path = format!("{path}?{query}");
            forbidden(&get(&server, &path, &eu).await?, "?prefix=EU-", &path)?;
        }
    }
    // The same for every way to start a stream: the refusal comes before any of it.
    for start in ["&from=tape", "&until=head", "&cursor=garbage"] {
        let path = format!("/views/prices/events?prefix=US-{start}");
        forbidden(&get(&server, &path, &eu).await?, "?prefix=EU-", &path)?;
    }
    // Bad narrowing is still a 400, checked first.
    expect::json_error(&get(&server, "/views/prices?prefix=", &eu).await?, 400)?;

    // GET /views lists the view, counting only the granted keys.
    ensure!(listed(&server, &eu, "prices").await?["keys"] == 2);
    ensure!(listed(&server, &full, "prices").await?["keys"] == 4);

    // The stream from the state: the grant's keys, then only their events.
    let mut stream = server
        .sse("/views/prices/events", &[("Authorization", &eu)])
        .await?;
    ensure!(synced_keys(&mut stream).await? == eu_keys);
    // Narrowed within the grant: only those keys.
    let mut one = server
        .sse("/views/prices/events?keys=EU-2", &[("Authorization", &eu)])
        .await?;
    ensure!(synced_keys(&mut one).await? == set(&["EU-2"]));
    // The browser's cookie is read under the same grant.
    let cookie = format!("viewtape_token={}", eu.trim_start_matches("Bearer "));
    let mut by_cookie = server
        .sse("/views/prices/events", &[("Cookie", &cookie)])
        .await?;
    ensure!(synced_keys(&mut by_cookie).await? == eu_keys);
    ingest(&server, "demo", &feed.batch(4)).await?;
    for seq in [9, 10] {
        expect::update(&stream.next_event().await?, seq, feed.symbol_of(seq), seq)?;
        expect::update(
            &by_cookie.next_event().await?,
            seq,
            feed.symbol_of(seq),
            seq,
        )?;
    }
    expect::update(&one.next_event().await?, 10, "EU-2", 10)?;
    stream.expect_silence(Duration::from_millis(300)).await?;
    one.expect_silence(Duration::from_millis(100)).await?;

    // The tape: only the grant's events; with `?until=head`, to the head and the end.
    let mut tape = server
        .sse(
            "/views/prices/events?from=tape&until=head",
            &[("Authorization", &eu)],
        )
        .await?;
    for seq in [1, 2, 5, 6, 9, 10] {
        expect::update(&tape.next_event().await?, seq, feed.symbol_of(seq), seq)?;
    }
    ensure!(tape.next_within(Duration::from_secs(5)).await?.is_none());
    let mut head = server
        .sse("/views/prices/events?until=head", &[("Authorization", &eu)])
        .await?;
    ensure!(synced_keys(&mut head).await? == eu_keys);
    ensure!(head.next_within(Duration::from_secs(5)).await?.is_none());

    // A cursor a full stream gave (seq 3, a US key), resumed under the grant: only its keys'
    // events after it, by Last-Event-ID and by ?cursor= alike, then live.
    let mut full_tape = server
        .sse(
            "/views/prices/events?from=tape",
            &[("Authorization", &full)],
        )
        .await?;
    let mut from_full = None;
    for seq in 1..=3 {
        from_full = Some(expect::update(
            &full_tape.next_event().await?,
            seq,
            feed.symbol_of(seq),
            seq,
        )?);
    }
    let from_full = from_full.context("a cursor")?.to_string();
    let mut by_header = server
        .sse(
            "/views/prices/events",
            &[("Authorization", &eu), ("Last-Event-ID", &from_full)],
        )
        .await?;
    let mut by_query = server
        .sse(
            &format!("/views/prices/events?cursor={from_full}"),
            &[("Authorization", &eu)],
        )
        .await?;
    let mut by_query_until = server
        .sse(
            &format!("/views/prices/events?cursor={from_full}&until=head"),
            &[("Authorization", &eu)],
        )
        .await?;
    for seq in [5, 6, 9, 10] {
        for resumed in [&mut by_header, &mut by_query, &mut by_query_until] {
            expect::update(&resumed.next_event().await?, seq, feed.symbol_of(seq), seq)?;
        }
    }
    ensure!(by_query_until
        .next_within(Duration::from_secs(5))
        .await?
        .is_none());
    ingest(&server, "demo", &feed.batch(4)).await?;
    for seq in [13, 14] {
        expect::update(
            &by_header.next_event().await?,
            seq,
            feed.symbol_of(seq),
            seq,
        )?;
        expect::update(&by_query.next_event().await?, seq, feed.symbol_of(seq), seq)?;
    }
    by_header.expect_silence(Duration::from_millis(300)).await?;

    // Resets — a malformed cursor, one of another life of the server — give the grant's state.
    for (cursor, reason) in [
        ("garbage", "malformed"),
        ("0123456789abcdef-3", "stale_epoch"),
    ] {
        let mut reset = server
            .sse(
                "/views/prices/events",
                &[("Authorization", &eu), ("Last-Event-ID", cursor)],
            )
            .await?;
        expect::reset(&reset.next_event().await?, reason)?;
        ensure!(synced_keys(&mut reset).await? == eu_keys, "{reason}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_grants_of_one_view_join_or_ask_the_reader_to_narrow() -> anyhow::Result<()> {
    let (server, _config) = start().await?;
    let mut feed = Feed::new(&SYMBOLS);
    ingest(&server, "demo", &feed.batch(4)).await?;
    let all = set(&SYMBOLS);

    // A full grant beside a narrowed one wins.
    let wide = bearer(&["prices?prefix=EU-", "prices"]);
    ensure!(state_keys(&get(&server, "/views/prices", &wide).await?)? == all);
    let resp = get(&server, "/views/prices?prefix=US-", &wide).await?;
    ensure!(state_keys(&resp)? == set(&["US-1", "US-2"]));
    let wide = bearer(&["prices?keys=EU-1", "pri*"]);
    ensure!(state_keys(&get(&server, "/views/prices", &wide).await?)? == all);

    // Narrowed grants that one narrowing joins: read as that one.
    for (views, expected) in [
        (
            &["prices?keys=EU-1", "prices?keys=US-2"][..],
            &["EU-1", "US-2"][..],
        ),
        (&["pri*?keys=EU-1", "prices?keys=US-2"], &["EU-1", "US-2"]),
        (
            &[
                "prices?prefix=EU-",
                "prices?prefix=EU-1",
                "prices?keys=EU-2",
            ],
            &["EU-1", "EU-2"],
        ),
    ] {
        let token = bearer(views);
        let state = state_keys(&get(&server, "/views/prices", &token).await?)?;
        ensure!(state == set(expected), "{views:?}: {state:?}");
        let mut stream = server
            .sse("/views/prices/events", &[("Authorization", &token)])
            .await?;
        ensure!(
            synced_keys(&mut stream).await? == set(expected),
            "{views:?}"
        );
    }

    // Narrowed grants that no one narrowing joins: a read of its own within them is served;
    // one without is a 403 asking for a narrowing.
    let split = bearer(&["prices?prefix=EU-", "prices?keys=US-1"]);
    for path in ["/views/prices", "/views/prices/events"] {
        let error = expect::json_error(&get(&server, path, &split).await?, 403)?;
        ensure!(error["error"] == "forbidden", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("?prefix=EU-") && message.contains("?keys=US-1"),
            "{message}"
        );
        ensure!(message.contains("narrow the read"), "{message}");
        let path = format!("{path}?prefix=US-");
        forbidden(&get(&server, &path, &split).await?, "?keys=US-1", &path)?;
    }
    let resp = get(&server, "/views/prices?keys=EU-2,US-1", &split).await?;
    ensure!(state_keys(&resp)? == set(&["EU-2", "US-1"]));
    let resp = get(&server, "/views/prices?prefix=EU-2", &split).await?;
    ensure!(state_keys(&resp)? == set(&["EU-2"]));
    let mut stream = server
        .sse(
            "/views/prices/events?keys=EU-1,US-1",
            &[("Authorization", &split)],
        )
        .await?;
    ensure!(synced_keys(&mut stream).await? == set(&["EU-1", "US-1"]));
    // The view is listed; its keys are those of either grant.
    ensure!(listed(&server, &split, "prices").await?["keys"] == 3);

    // A narrowing this server does not read grants nothing (it does not name some view
    // `prices?region=EU` either); an ingest grant cannot be narrowed.
    let odd = bearer(&["prices?region=EU", "prices?prefix=EU-&keys=US-1"]);
    let error = expect::json_error(&get(&server, "/views/prices", &odd).await?, 403)?;
    ensure!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("does not grant view"),
        "{error}"
    );
    let listed = get(&server, "/views", &odd).await?.json()?;
    ensure!(
        !listed.to_string().contains("\"prices\""),
        "not listed: {listed}"
    );
    let narrowed_writer = format!(
        "Bearer {}",
        hs256(SECRET, 60, "viewtape", &[], &["demo?prefix=EU-"])
    );
    let resp = http::request(
        server.addr(),
        "POST",
        "/runtimes/demo/ingest",
        &[("Authorization", &narrowed_writer)],
        feed.batch(1).as_bytes(),
    )
    .await?;
    expect::json_error(&resp, 403)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_public_view_needs_a_token_for_its_other_keys() -> anyhow::Result<()> {
    let (server, _config) = start().await?;
    ingest(
        &server,
        "notes",
        "publish public open-1 1\npublish public open-2 2\npublish public secret-1 3\n",
    )
    .await?;
    // Without a token: the public keys, by state and stream alike.
    let resp = http::request(server.addr(), "GET", "/views/public", &[], b"").await?;
    ensure!(state_keys(&resp)? == set(&["open-1", "open-2"]));
    let mut stream = server.sse("/views/public/events", &[]).await?;
    ensure!(synced_keys(&mut stream).await? == set(&["open-1", "open-2"]));
    let resp = http::request(server.addr(), "GET", "/views/public?keys=open-2", &[], b"").await?;
    ensure!(state_keys(&resp)? == set(&["open-2"]));
    // Its other keys need a token: 401, saying what is public.
    for path in [
        "/views/public?prefix=secret-",
        "/views/public/events?keys=open-1,secret-1",
    ] {
        let resp = http::request(server.addr(), "GET", path, &[], b"").await?;
        let error = expect::json_error(&resp, 401)?;
        ensure!(resp.header("www-authenticate") == Some("Bearer"), "{path}");
        ensure!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("?prefix=open-"),
            "{path}: {error}"
        );
    }
    // A token that grants the view joins the public grant: all of it.
    let token = bearer(&["public"]);
    let all = set(&["open-1", "open-2", "secret-1"]);
    ensure!(state_keys(&get(&server, "/views/public", &token).await?)? == all);
    // One that grants other views reads the public keys, and no others.
    let other = bearer(&["prices"]);
    ensure!(
        state_keys(&get(&server, "/views/public", &other).await?)? == set(&["open-1", "open-2"])
    );
    let path = "/views/public?prefix=secret-";
    forbidden(&get(&server, path, &other).await?, "?prefix=open-", path)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_reauth_a_narrower_token_resumes_only_within_its_grant() -> anyhow::Result<()> {
    let (server, _config) = start().await?;
    let mut feed = Feed::new(&SYMBOLS);
    ingest(&server, "demo", &feed.batch(4)).await?;
    // Two streams under a full token that runs out in 2 s: one of every key from the tape,
    // one narrowed to the US keys.
    let short = format!("Bearer {}", hs256(SECRET, 2, "viewtape", &["prices"], &[]));
    let mut every = server
        .sse(
            "/views/prices/events?from=tape",
            &[("Authorization", &short)],
        )
        .await?;
    let mut us = server
        .sse(
            "/views/prices/events?prefix=US-",
            &[("Authorization", &short)],
        )
        .await?;
    let mut last = None;
    for seq in 1..=4 {
        last = Some(expect::update(
            &every.next_event().await?,
            seq,
            feed.symbol_of(seq),
            seq,
        )?);
    }
    let last = last.context("a cursor")?.to_string();
    let (_, synced) = us.until_synced(10).await?;
    let us_cursor = expect::cursor_of(&synced)?.to_string();
    // The token runs out: each ends with `reauth`, then the end of the response — neither goes
    // on under the token it was opened with.
    for stream in [&mut every, &mut us] {
        let event = stream
            .next_within(Duration::from_secs(10))
            .await?
            .context("reauth before the end")?;
        ensure!(event.event == "reauth" && event.id.is_none(), "{event:?}");
        ensure!(stream.next_within(Duration::from_secs(5)).await?.is_none());
    }
    ingest(&server, "demo", &feed.batch(4)).await?;

    // The renewed token grants only the EU keys. The full stream's client resumes from its
    // cursor and gets only those keys' events; the US stream's client is refused, not served.
    let eu = bearer(&["prices?prefix=EU-"]);
    let mut resumed = server
        .sse(
            "/views/prices/events",
            &[("Authorization", &eu), ("Last-Event-ID", &last)],
        )
        .await?;
    for seq in [5, 6] {
        expect::update(&resumed.next_event().await?, seq, feed.symbol_of(seq), seq)?;
    }
    resumed.expect_silence(Duration::from_millis(300)).await?;
    let resp = http::request(
        server.addr(),
        "GET",
        "/views/prices/events?prefix=US-",
        &[("Authorization", &eu), ("Last-Event-ID", &us_cursor)],
        b"",
    )
    .await?;
    forbidden(&resp, "?prefix=EU-", "a US stream renewed with an EU token")?;
    Ok(())
}
