//! The `viewtape` subcommands besides `serve`: what the binary's command line hands over to.
//!
//! | file | job |
//! |---|---|
//! | `admin.rs` | the admin client: one request to a running server's admin routes, with the token |
//! | `check.rs` | `viewtape check-config`, and the checks `serve --config` makes first |
//! | `deploy.rs` | `viewtape deploy`: a new module sent to a running server's admin route |
//! | `inspect.rs` | `viewtape snapshot …` and `viewtape log …`: read snapshot and log files |
//! | `runtime.rs` | `viewtape runtime put`, `get` and `delete`, and `viewtape module put`: runtimes as data |
//! | `run.rs` | `viewtape run`: a guest over recorded input |
//! | `scaffold/` | `viewtape new`: a guest, as a Rust crate or a TypeScript/JavaScript package |

pub mod admin;
pub mod check;
pub mod deploy;
pub mod inspect;
pub mod run;
pub mod runtime;
pub mod scaffold;
