//! The `viewtape` binary: parses arguments and hands over to the library.

/// mimalloc: see the note in `Cargo.toml`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;
use viewtape_server::Config;
use viewtape_server::{admin_command, AdminCommand, RuntimeDefinition};
use viewtape_server::{check_file, declarations};
use viewtape_server::{serve, ServeOptions};

/// The variable that sets `--log-format`.
const LOG_FORMAT_ENV: &str = "VIEWTAPE_LOG_FORMAT";

/// A streaming server for WebAssembly ingestion runtimes, with resumable SSE views.
#[derive(Debug, Parser)]
#[command(name = "viewtape", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written (to stderr): `text`, coloured only on a terminal and without
    /// NO_COLOR set, or `json`, one object per line, for files and log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = LOG_FORMAT_ENV)]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// One line of text per event.
    Text,
    /// One JSON object per event and line.
    Json,
}

/// `viewtape new --lang`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Lang {
    /// A Rust crate, built for `wasm32-unknown-unknown`.
    Rust,
    /// A TypeScript npm package, bundled to one `dist/guest.js`.
    #[value(alias = "typescript")]
    Ts,
    /// A JavaScript npm package, bundled to one `dist/guest.js`.
    #[value(alias = "javascript")]
    Js,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server. Without --config: the embedded demo (runtime `demo`, view `prices`).
    #[command(after_help = serve_environment())]
    Serve {
        /// Address to listen on: an IP address and a port, or a host name and a port
        /// (`localhost:8080`: the name's first IPv4 address, else its first). Port 0 picks a
        /// free one.
        #[arg(long, default_value = "127.0.0.1:8080", value_parser = listen_address)]
        listen: SocketAddr,
        /// Where snapshots, the log and deployed modules are kept.
        #[arg(long, default_value = "./viewtape-data")]
        data_dir: PathBuf,
        /// A TOML config file naming runtimes, limits and retention. Relative paths in it are
        /// relative to its own directory.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Synthetic ticks per second into the `demo` runtime (0 turns the feed off).
        #[arg(long, default_value_t = 5)]
        demo_rate: u32,
        /// Join a cluster: the input log is the JetStream stream on this NATS server
        /// (`[cluster] nats_url`).
        #[arg(long)]
        nats: Option<String>,
    },
    /// Check a config file as `serve --config FILE` does before it starts, without starting:
    /// syntax, keys, types, values, declared views, and that every module, certificate and key
    /// file it names loads (relative paths from the file's directory). Exits 1 naming the file,
    /// the line and the key of the first problem.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
        /// Also say what the next start over this data directory does with each runtime the
        /// file declares: runs it as declared, declares it by a record, or skips the
        /// declaration because a change made through the API since stands.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Deploy a new module to a runtime of a running server, without a restart: the guest's
    /// state carries over, no client notices. Needs the server's admin token in
    /// VIEWTAPE_ADMIN_TOKEN.
    Deploy {
        /// The runtime.
        runtime: String,
        /// The new module (`.wasm`, or `.js` for a JavaScript guest).
        wasm: PathBuf,
        #[command(flatten)]
        server: AdminServer,
    },
    /// Create, replace, show or delete a runtime of a running server, without a restart (each
    /// change is a record of its log). Needs the server's admin token in VIEWTAPE_ADMIN_TOKEN.
    #[command(subcommand)]
    Runtime(RuntimeCommand),
    /// Upload a module to a running server, for `runtime put --module sha256:…`. Needs the
    /// server's admin token in VIEWTAPE_ADMIN_TOKEN.
    #[command(subcommand)]
    Module(ModuleCommand),
    /// Inspect snapshot files.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Inspect the log.
    #[command(subcommand)]
    Log(LogCommand),
    /// Write a new guest NAME (publishing to the view NAME) that builds and passes its tests as
    /// generated: a Rust crate, or a TypeScript or JavaScript npm package.
    New {
        /// The guest's and its view's name.
        name: String,
        /// Where to create it.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The guest's language.
        #[arg(long, value_enum, default_value_t = Lang::Rust)]
        lang: Lang,
        /// A viewtape checkout's SDK to depend on by path: its `runtime-guest` directory for
        /// Rust, its `clients/guest` directory (or a tarball `npm pack` made of it) for ts and js;
        /// default: the SDK of this release (Rust: its tag in viewtape's repository, by git;
        /// ts and js: `@viewtape/guest` of its version).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Run a guest module over recorded input (stdin), batch by batch, in the real host with the
    /// real limits; prints what each batch published, gaps and errors as NDJSON. Exits 1 when
    /// any batch failed, saying how many.
    Run {
        /// The guest module (`.wasm`, or `.js` for a JavaScript guest).
        wasm: PathBuf,
        /// A file whose bytes are handed to the guest's `init` (its `config`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// A saved state to start from (as written by `--save-state`).
        #[arg(long)]
        state: Option<PathBuf>,
        /// Where to write the final saved state.
        #[arg(long)]
        save_state: Option<PathBuf>,
        /// Input lines per batch.
        #[arg(long, default_value_t = 1000)]
        batch_lines: usize,
        /// CPU per batch, in fuel (`[runtime.limits] fuel`).
        #[arg(long, default_value_t = viewtape_server::DEFAULT_FUEL)]
        fuel: u64,
        /// The ingest time every batch gets, in Unix milliseconds (what a guest's batch time,
        /// and a JavaScript guest's `Date.now()`, give); by default the clock when it runs.
        #[arg(long)]
        batch_time: Option<u64>,
    },
}

/// The running server an admin command talks to.
#[derive(Debug, clap::Args)]
struct AdminServer {
    /// The server: `host:port`, or a URL (`http://host:port`, `https://host[:port]`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    server: String,
    /// For https: the PEM certificates to trust (default: the system's, from
    /// `$SSL_CERT_FILE` or /etc/ssl/certs/ca-certificates.crt).
    #[arg(long)]
    cacert: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum RuntimeCommand {
    /// Create the runtime NAME, or replace it (the guest's state carries over, as by a deploy);
    /// prints its definition and status.
    Put {
        /// The runtime.
        name: String,
        /// Its module: `builtin:<guest>` (json, ticker, …), `sha256:<hex>` of a module uploaded
        /// already, or a module file, uploaded first.
        #[arg(long)]
        module: String,
        /// A view it publishes to, or a pattern (`chat.*`); repeat for more.
        #[arg(long = "view", required = true)]
        views: Vec<String>,
        /// The text handed to the guest's `init`.
        #[arg(long)]
        config: Option<String>,
        /// A JSON Schema for one of its views: VIEW=FILE; repeat for more.
        #[arg(long = "schema", value_parser = view_and_file)]
        schemas: Vec<(String, PathBuf)>,
        #[command(flatten)]
        server: AdminServer,
    },
    /// Print the runtime's definition and status.
    Get {
        /// The runtime.
        name: String,
        #[command(flatten)]
        server: AdminServer,
    },
    /// Delete the runtime: its ingest answers 404 from then on, its views are retired (their
    /// streams end with `event: retired`).
    Delete {
        /// The runtime.
        name: String,
        #[command(flatten)]
        server: AdminServer,
    },
}

#[derive(Debug, Subcommand)]
enum ModuleCommand {
    /// Upload a module (`.wasm`): the server checks it, keeps it and prints its `sha256:…`.
    Put {
        /// The module file.
        file: PathBuf,
        #[command(flatten)]
        server: AdminServer,
    },
}

/// `--schema VIEW=FILE`.
fn view_and_file(text: &str) -> anyhow::Result<(String, PathBuf)> {
    let (view, file) = text
        .split_once('=')
        .filter(|(view, file)| !view.is_empty() && !file.is_empty())
        .with_context(|| format!("{text:?}: give VIEW=FILE"))?;
    Ok((view.to_owned(), PathBuf::from(file)))
}

#[derive(Debug, Subcommand)]
enum LogCommand {
    /// Print the input of every batch a runtime committed that the log still holds (since the
    /// oldest kept snapshot), in order, as it arrived: NDJSON ready for `viewtape run`.
    Dump {
        /// The log directory (`<data-dir>/log`).
        dir: PathBuf,
        /// The runtime.
        runtime: String,
    },
    /// Print every segment, its positions and any damage; exit 1 on damage. Changes nothing.
    Inspect {
        /// The log directory (`<data-dir>/log`).
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Print a snapshot's header, epoch, views and validity.
    Inspect {
        /// The snapshot file.
        file: PathBuf,
    },
    /// Check every snapshot in a directory.
    Verify {
        /// The snapshot directory (`<data-dir>/snapshots`).
        dir: PathBuf,
    },
}

/// The environment `viewtape serve` reads, for its `--help`.
fn serve_environment() -> String {
    format!(
        "Environment:
  {secret:<21} the HS256 secret of clients' tokens: auth is on with it (or with [auth] public_keys)
  {admin:<21} the bearer token of the /admin routes (`viewtape deploy`, `runtime`, `module`); unset: no admin routes
  {format:<21} the log format, as --log-format
  RUST_LOG              which log lines are written (default: info; e.g. viewtape_server=debug)
  NO_COLOR              set (and not empty): log lines without colours, even on a terminal",
        secret = viewtape_server::SECRET_ENV,
        admin = viewtape_server::ADMIN_TOKEN_ENV,
        format = LOG_FORMAT_ENV,
    )
}

/// `--listen`: an IP address and a port, or a host name and a port, resolved here, once; of a
/// name's addresses, the first IPv4 one (what `localhost` means to most clients), else the first.
fn listen_address(text: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    const HINT: &str = "use an IP address and a port, such as 127.0.0.1:8080";
    let addresses: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(text)
        .map_err(|error| {
            anyhow::anyhow!(
                "not an address, nor a host name and a port that resolve ({error}); {HINT}"
            )
        })?
        .collect();
    addresses
        .iter()
        .find(|address| address.is_ipv4())
        .or(addresses.first())
        .copied()
        .with_context(|| format!("{text} resolves to no address; {HINT}"))
}

/// Installs the log subscriber: `format` on stderr, filtered by `RUST_LOG` (default `info`),
/// with ANSI colours only when stderr is a terminal and `NO_COLOR` is unset or empty, so that
/// files and pipes get plain text.
fn install_logs(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
            logs.with_ansi(colour).init();
        }
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// Runs the command; an error is printed as one line (with its causes), never with a backtrace,
/// and the process exits 1.
fn main() {
    let cli = Cli::parse();
    install_logs(cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => Err(anyhow::anyhow!("cannot start the async runtime: {error}")),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            listen,
            data_dir,
            config,
            demo_rate,
            nats,
        } => {
            let override_nats = |config: &mut Config| {
                if nats.is_some() {
                    config.cluster.nats_url = nats;
                }
            };
            let config = match &config {
                Some(path) => check_file(path, override_nats)?,
                None => {
                    let mut config = Config::default();
                    override_nats(&mut config);
                    config
                }
            };
            serve(ServeOptions {
                listen,
                data_dir,
                config,
                demo_rate,
            })
            .await
        }
        Command::CheckConfig { file, data_dir } => {
            let config = check_file(&file, |_| {})?;
            let runtimes: Vec<String> = config
                .runtimes
                .iter()
                .map(|runtime| format!("{} ({})", runtime.name, runtime.views.join(", ")))
                .collect();
            println!(
                "{}: ok; runtimes and their views: {}",
                file.display(),
                runtimes.join("; ")
            );
            if let Some(data_dir) = data_dir {
                let declaring = declarations(&config, &data_dir).map_err(|problem| {
                    anyhow::anyhow!("{}: {}", data_dir.display(), problem.message)
                })?;
                println!("at the next start over {}:", data_dir.display());
                for (runtime, declaring) in declaring {
                    println!("  {runtime}: {declaring}");
                }
            }
            Ok(())
        }
        Command::Snapshot(SnapshotCommand::Inspect { file }) => {
            let ok = viewtape_server::inspect_file(&file, &mut std::io::stdout())?;
            std::process::exit(if ok { 0 } else { 1 })
        }
        Command::New {
            name,
            dir,
            lang,
            sdk,
        } => {
            let script = match lang {
                Lang::Rust => None,
                Lang::Ts => Some(viewtape_server::Script::TypeScript),
                Lang::Js => Some(viewtape_server::Script::JavaScript),
            };
            let (created, next) = match script {
                None => {
                    let sdk = sdk.map_or_else(
                        viewtape_server::Sdk::this_release,
                        viewtape_server::Sdk::Path,
                    );
                    (viewtape_server::new_guest(&name, &dir, &sdk)?, "cargo test")
                }
                Some(script) => {
                    let sdk = sdk.map_or_else(
                        viewtape_server::NpmSdk::this_release,
                        viewtape_server::NpmSdk::Path,
                    );
                    let created = viewtape_server::new_script_guest(&name, &dir, script, &sdk)?;
                    (created, "npm install && npm test")
                }
            };
            println!(
                "created {}: cd there, then `{next}`; its README says how to build and run it",
                created.display()
            );
            Ok(())
        }
        Command::Run {
            wasm,
            config,
            state,
            save_state,
            batch_lines,
            fuel,
            batch_time,
        } => {
            let read = |path: &PathBuf| {
                std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
            };
            let options = viewtape_server::RunOptions {
                wasm: read(&wasm)?,
                config: config.as_ref().map(read).transpose()?.unwrap_or_default(),
                state: state.as_ref().map(read).transpose()?,
                batch_lines,
                batch_time,
                limits: viewtape_server::Limits {
                    fuel,
                    ..viewtape_server::Limits::default()
                },
            };
            let stdin = std::io::stdin().lock();
            let ran = viewtape_server::run(options, stdin, &mut std::io::stdout())
                .await
                .with_context(|| wasm.display().to_string())?;
            if let Some(path) = save_state {
                std::fs::write(&path, &ran.state)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            }
            anyhow::ensure!(
                ran.failed == 0,
                "{} of {} batches failed (their `error` lines on stdout say why)",
                ran.failed,
                ran.batches
            );
            Ok(())
        }
        Command::Deploy {
            runtime,
            wasm,
            server,
        } => {
            let answer = viewtape_server::deploy_module(&viewtape_server::DeployOptions {
                runtime,
                wasm,
                server: server.server,
                cacert: server.cacert,
            })
            .await?;
            println!("{}", answer.into_body()?);
            Ok(())
        }
        Command::Runtime(command) => {
            let (server, command) = match command {
                RuntimeCommand::Put {
                    name,
                    module,
                    views,
                    config,
                    schemas,
                    server,
                } => (
                    server,
                    AdminCommand::PutRuntime {
                        name,
                        definition: RuntimeDefinition {
                            module,
                            views,
                            config,
                            schemas,
                        },
                    },
                ),
                RuntimeCommand::Get { name, server } => (server, AdminCommand::GetRuntime { name }),
                RuntimeCommand::Delete { name, server } => {
                    (server, AdminCommand::DeleteRuntime { name })
                }
            };
            let body = admin_command(&server.server, server.cacert, command).await?;
            println!("{body}");
            Ok(())
        }
        Command::Module(ModuleCommand::Put { file, server }) => {
            let body = admin_command(
                &server.server,
                server.cacert,
                AdminCommand::PutModule { file },
            )
            .await?;
            println!("{body}");
            Ok(())
        }
        Command::Log(LogCommand::Dump { dir, runtime }) => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let dumped = viewtape_server::dump_log(&dir, &runtime, &mut out)?;
            std::io::Write::flush(&mut out)?;
            match dumped {
                Ok(batches) => {
                    eprintln!("{batches} batches of runtime {runtime:?}");
                    Ok(())
                }
                Err(why) => anyhow::bail!("{why}"),
            }
        }
        Command::Log(LogCommand::Inspect { dir }) => {
            let ok = viewtape_server::inspect_log(&dir, &mut std::io::stdout())?;
            std::process::exit(if ok { 0 } else { 1 })
        }
        Command::Snapshot(SnapshotCommand::Verify { dir }) => {
            let ok = viewtape_server::verify_dir(&dir, &mut std::io::stdout())?;
            std::process::exit(if ok { 0 } else { 1 })
        }
    }
}
