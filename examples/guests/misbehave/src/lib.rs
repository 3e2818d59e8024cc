//! `misbehave`: a test fixture for the viewtape host, not an example to copy. Each input line
//! is a command:
//!
//! | line | does |
//! |---|---|
//! | `publish <view> <key> <payload>` | publishes |
//! | `delete <view> <key>` | deletes |
//! | `gap <reason…>` | reports a gap |
//! | `count` | increments the saved counter and publishes it as `state/count` |
//! | `log <msg…>` | logs at info |
//! | `big <view> <bytes>` | publishes a payload of that many bytes |
//! | `fail <msg…>` | rejects the batch |
//! | `panic <msg…>` | panics (a trap, with the message reported first) |
//! | `loop` | loops forever |
//! | `oom` | allocates until memory runs out |
//!
//! Config `fail` makes `init` fail; config `schema <view> <JSON Schema>` declares that schema
//! for the view.

use viewtape_guest::{export_runtime, Context, Error, Level, Result, Runtime, Schemas};

/// The fixture runtime; its state is one counter.
#[derive(Debug, Default)]
pub struct Misbehave {
    count: u64,
    /// The view and schema its config declares.
    schema: Option<(String, String)>,
}

impl Runtime for Misbehave {
    fn init(config: &[u8]) -> Result<Self> {
        if config == b"fail" {
            return Err(Error::msg("config says fail"));
        }
        let config = std::str::from_utf8(config).map_err(Error::msg)?;
        let schema = config
            .strip_prefix("schema ")
            .and_then(|rest| rest.split_once(' '))
            .map(|(view, schema)| (view.to_owned(), schema.to_owned()));
        Ok(Self { count: 0, schema })
    }

    fn schemas(&self) -> Schemas {
        match &self.schema {
            Some((view, schema)) => Schemas::new().view_json(view, schema.as_str()),
            None => Schemas::new(),
        }
    }

    fn on_batch(&mut self, input: &[u8], ctx: &mut Context) -> Result<()> {
        let text = std::str::from_utf8(input).map_err(Error::msg)?;
        for line in text.lines() {
            let mut words = line.splitn(4, ' ');
            let cmd = words.next().unwrap_or("");
            let mut arg = || words.next().unwrap_or("");
            match cmd {
                "publish" => {
                    let (view, key, payload) = (arg(), arg(), arg());
                    ctx.publish(view, key, payload.as_bytes());
                }
                "delete" => {
                    let (view, key) = (arg(), arg());
                    ctx.delete(view, key);
                }
                "gap" => ctx.report_gap(line.trim_start_matches("gap ")),
                "count" => {
                    self.count += 1;
                    ctx.publish("state", "count", self.count.to_string().as_bytes());
                }
                "log" => ctx.log(Level::Info, line.trim_start_matches("log ")),
                "big" => {
                    let view = arg();
                    let n: usize = arg().parse().map_err(Error::msg)?;
                    ctx.publish(view, "big", &vec![b'x'; n]);
                }
                "fail" => return Err(Error::msg(line.trim_start_matches("fail "))),
                "panic" => panic!("{}", line.trim_start_matches("panic ")),
                "loop" => {
                    let mut n: u64 = 0;
                    loop {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                }
                "oom" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
                    }
                }
                "" => {}
                other => return Err(Error::msg(format!("unknown command {other:?}"))),
            }
        }
        Ok(())
    }

    fn save(&self) -> Vec<u8> {
        self.count.to_string().into_bytes()
    }

    fn restore(&mut self, state: &[u8]) -> Result<()> {
        let text = std::str::from_utf8(state).map_err(Error::msg)?;
        self.count = text.parse().map_err(Error::msg)?;
        Ok(())
    }
}

export_runtime!(Misbehave);
