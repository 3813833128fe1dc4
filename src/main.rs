//! The `loopwarden` command line: `run`, `demo`, `simulate`, `replay`, `eval`,
//! `check-config`. Exit codes: 0 done, 1 `eval` cases failed, 2 any error (the message
//! says what and where).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use loopwarden::backtest::{backtest, Outcomes};
use loopwarden::config::Config;
use loopwarden::demo::{demo, DemoOptions};
use loopwarden::driver::Input;
use loopwarden::eval::run_corpus;
use loopwarden::feed::{feed, write_truth, FeedProducer, Routing, Target, FILE_CLOCK};
use loopwarden::ingest::{looks_like_otlp_json, OtlpIngest, OtlpJsonLines};
use loopwarden::kafka::{self, embedded::EmbeddedBroker};
use loopwarden::pipeline;
use loopwarden::replay::{replay, Format, ReplayOptions};
use loopwarden::shutdown::Shutdown;
use loopwarden::simulate::{Fleet, FleetSpec};
use loopwarden::telemetry::{http, Metrics, Spans, Telemetry};

/// mimalloc rather than the system allocator: replay and the pipeline are faster with
/// it, and scale better over threads (docs/DEVELOPMENT.md, "Performance").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// loopwarden stops runaway AI agents: it reads agent events (LLM calls and tool calls),
/// detects loops and runaways per session, and emits warnings, terminations and summaries.
#[derive(Parser)]
#[command(name = "loopwarden", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr (`text` for people, `json` for log pipelines); the level
    /// comes from RUST_LOG (default `info`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "LOOPWARDEN_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Copy, Clone, ValueEnum)]
enum FormatArg {
    Json,
    Table,
}

/// What an input file holds.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum InputArg {
    /// OTLP JSON when the first line that is not blank is a trace export
    /// (`{"resourceSpans": …`), else events.
    Auto,
    /// loopwarden events, one JSON object a line.
    Events,
    /// OTLP JSON trace exports, one a line (the Collector's file exporter).
    OtlpJson,
}

#[derive(Subcommand)]
enum Command {
    /// Consume agent events from Kafka, publish warnings, terminations and summaries.
    ///
    /// With `kafka.brokers` unset it starts an embedded in-memory broker (for trying it
    /// out) and prints its address. SIGTERM / SIGINT stop it gracefully: it stops
    /// fetching, delivers and stores what it has, commits, and exits 0 within
    /// `kafka.shutdown_deadline_secs`.
    Run {
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Everything in one process: embedded broker, simulated fleet, the real pipeline;
    /// prints terminations as they happen and a stop-reason table at the end.
    Demo {
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// Sessions to simulate.
        #[arg(long, default_value_t = 300)]
        sessions: u64,
        /// Events per second.
        #[arg(long, default_value_t = 3000.0)]
        rate: f64,
        /// Share of sessions that fall into a loop (0..1).
        #[arg(long, value_parser = share, default_value_t = 0.3)]
        loop_share: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Generate a realistic fleet of agent sessions (healthy ones, and looping ones that
    /// fall into a loop after a healthy start) to a broker or a JSON Lines file.
    ///
    /// Example: loopwarden simulate --sessions 1000 --output fleet.jsonl --truth truth.jsonl
    Simulate {
        /// Configuration (its [kafka] section gives the client settings and input topics).
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// Produce to these brokers (`host:port,…`) instead of writing a file.
        #[arg(long, conflicts_with = "output")]
        brokers: Option<String>,
        /// Put every event on this topic (default: by type onto the configured input topics).
        #[arg(long, requires = "brokers")]
        topic: Option<String>,
        /// JSON Lines output file (`-` for stdout).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Write the ground truth (which sessions loop, how, from which event) here.
        #[arg(long)]
        truth: Option<PathBuf>,
        #[arg(long, default_value_t = 1000)]
        sessions: u64,
        /// Sessions in flight at once.
        #[arg(long, default_value_t = 100)]
        concurrency: usize,
        /// Share of sessions that fall into a loop (0..1).
        #[arg(long, value_parser = share, default_value_t = 0.2)]
        loop_share: f64,
        /// Events per second (0: as fast as possible).
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Run the detectors over a JSON Lines file of events (or `-` for stdin) and print
    /// every warning, termination and session summary as it happens.
    ///
    /// Each line is one input event (DESIGN §1). Bad lines are reported on stderr with
    /// their line number and skipped. The end of the input closes every open session.
    /// Example: loopwarden replay examples/sessions.jsonl --format table
    Replay {
        /// JSON Lines file of events, or `-` for standard input.
        input: PathBuf,
        /// Configuration file (defaults to the built-in defaults; LOOPWARDEN_* variables apply).
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// Output format: one JSON object a line, or a readable table.
        #[arg(long, value_enum, default_value = "json")]
        format: FormatArg,
        /// Stop at the first bad line instead of skipping it.
        #[arg(long)]
        strict: bool,
        /// Worker threads, sessions split between them, 1 to 256 (default: the cores
        /// available, at most 256).
        /// The output is the same for any number.
        #[arg(long, env = "LOOPWARDEN_THREADS")]
        threads: Option<usize>,
        /// What the input holds: loopwarden events, or OTLP JSON trace exports (mapped as
        /// `[ingest.otlp]` maps them); `auto` tells them apart by the first line that is not blank.
        #[arg(long, value_enum, default_value = "auto")]
        input_format: InputArg,
        /// Read a file with read calls instead of mapping it into memory. Use it for a
        /// file that may change during the run: mapped, a file cut short (e.g. rotated
        /// with copytruncate) or failing on disk ends the process with SIGBUS, one
        /// rewritten in place may be read half old, half new, and one that grows is read
        /// only up to its size at the start.
        #[arg(long)]
        no_mmap: bool,
    },
    /// What enforcing a configuration would have done to recorded sessions: sessions
    /// warned and killed per detector and per outcome, the kills of successful sessions,
    /// and the spend (tokens, cost, steps) after each kill point.
    ///
    /// Outcomes come from `session.completed` events (`"outcome": "success" | "failure"`)
    /// or, for logs without them, from `--outcomes`. Shadow-mode terminations count as
    /// kill points. Example: loopwarden backtest fleet.jsonl.gz --outcomes outcomes.jsonl
    Backtest {
        /// JSON Lines file of events (`.gz` is read compressed), or `-` for standard input.
        input: PathBuf,
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// JSON Lines of {"session_id": …, "outcome": "success" | "failure"}.
        #[arg(long)]
        outcomes: Option<PathBuf>,
        /// A table for people, or the report as one JSON object.
        #[arg(long, value_enum, default_value = "table")]
        format: FormatArg,
        /// Worker threads, sessions split between them, 1 to 256 (default: the cores
        /// available, at most 256).
        /// The report is the same for any number.
        #[arg(long, env = "LOOPWARDEN_THREADS")]
        threads: Option<usize>,
        /// What the input holds: loopwarden events, or OTLP JSON trace exports (mapped as
        /// `[ingest.otlp]` maps them); `auto` tells them apart by the first line that is not blank.
        #[arg(long, value_enum, default_value = "auto")]
        input_format: InputArg,
        /// Read a file with read calls instead of mapping it into memory. Use it for a
        /// file that may change during the run: mapped, a file cut short (e.g. rotated
        /// with copytruncate) or failing on disk ends the process with SIGBUS, one
        /// rewritten in place may be read half old, half new, and one that grows is read
        /// only up to its size at the start.
        #[arg(long)]
        no_mmap: bool,
    },
    /// Check a labelled scenario corpus: per case, whether its expectations hold, then
    /// totals (cases held, false alarms, false kills, late detections).
    ///
    /// Each line is {"id", "events": [...], "expect": {"first_finding_by", "terminate_by",
    /// "max_level"}}. Exits 1 when any case does not hold, so it can gate a config change.
    Eval {
        /// The corpus, one case per line.
        corpus: PathBuf,
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
        /// Also list every finding of every case.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Validate a configuration file (and LOOPWARDEN_* overrides), report every error at
    /// once, and print the effective configuration.
    CheckConfig {
        /// The file to check (it wins over `--config`); without either, the built-in
        /// defaults plus the environment.
        file: Option<PathBuf>,
        /// The file to check, named as the other commands take it.
        #[arg(long, short, env = "LOOPWARDEN_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Ask a running `loopwarden run` whether it is alive (`/healthz`) or ready
    /// (`/readyz`): exits 0 on HTTP 2xx, 1 otherwise. For container health checks, where
    /// the image has no curl.
    ///
    /// Example: loopwarden healthcheck --url http://127.0.0.1:9464/readyz
    Healthcheck {
        /// The endpoint to ask.
        #[arg(long, default_value = "http://127.0.0.1:9464/healthz")]
        url: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
}

/// A share, 0..=1 (for `--loop-share`).
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a share between 0 and 1")),
    }
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Arc<Config>> {
    let env = config_env(std::env::vars_os())?.into_iter();
    let config = match path {
        Some(p) => Config::load(p, env)?,
        None => Config::from_toml_str("", "defaults", env)?,
    };
    Ok(Arc::new(config))
}

/// The process environment as the configuration reads it: a `LOOPWARDEN_…` variable whose
/// name or value is not UTF-8 is an error naming it; any other such variable is none of
/// the configuration's business and is passed over (`std::env::vars` would panic on it).
fn config_env(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> anyhow::Result<Vec<(String, String)>> {
    use loopwarden::config::{ENV_PREFIX, RESERVED_ENV, RESERVED_ENV_PREFIX};
    let mut env = Vec::new();
    for (name, value) in vars {
        let bytes = name.as_encoded_bytes();
        // The command line's and the tools' own variables are not configuration keys
        // (`LOOPWARDEN_CONFIG` may name a path that is not UTF-8).
        let reserved = RESERVED_ENV.iter().any(|r| r.as_bytes() == bytes)
            || bytes.starts_with(RESERVED_ENV_PREFIX.as_bytes());
        let ours = bytes.starts_with(ENV_PREFIX.as_bytes()) && !reserved;
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => env.push((name, value)),
            (Ok(name), Err(_)) if ours => {
                anyhow::bail!("environment variable {name}: its value is not UTF-8")
            }
            (Err(name), _) if ours => anyhow::bail!(
                "environment variable {}: its name is not UTF-8",
                name.to_string_lossy()
            ),
            _ => {}
        }
    }
    Ok(env)
}

/// `--threads`, or every core available.
fn threads_or_cores(threads: Option<usize>) -> anyhow::Result<usize> {
    match threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(n) if n > loopwarden::driver::MAX_THREADS => anyhow::bail!(
            "--threads must be at most {} (it was {n})",
            loopwarden::driver::MAX_THREADS
        ),
        Some(n) => Ok(n),
        None => Ok(loopwarden::driver::available_threads()),
    }
}

/// The two bytes every gzip stream starts with (and no JSON line does).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A file or standard input (`-`), decompressed when it is gzip: told by its first two
/// bytes, whatever its name.
fn open_input(path: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    // Small: the driver reads whole batches into buffers of its own, and a read larger
    // than the buffer bypasses it (a large one would copy every byte once more).
    const BUFFER: usize = 1 << 16;
    let name = path.display();
    let mut raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("cannot open {name}"))?)
    };
    let mut head = Vec::with_capacity(2);
    (&mut raw)
        .take(2)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read {name}"))?;
    let gzip = head == GZIP_MAGIC;
    let whole = std::io::Cursor::new(head).chain(raw);
    if gzip {
        let gz = GzipMembers {
            state: Gzip::Member(Box::new(flate2::bufread::GzDecoder::new(
                BufReader::with_capacity(BUFFER, whole),
            ))),
            name: name.to_string(),
        };
        Ok(Box::new(BufReader::with_capacity(BUFFER, gz)))
    } else {
        Ok(Box::new(BufReader::with_capacity(BUFFER, whole)))
    }
}

/// The members of a gzip file one after another, as `gzip -d` reads them: bytes after the
/// last member that do not start another (zero padding, a partial copy) end the input
/// with a warning, instead of failing it after everything was read.
struct GzipMembers<R: BufRead> {
    state: Gzip<R>,
    name: String,
}

enum Gzip<R: BufRead> {
    /// Inside a member.
    Member(Box<flate2::bufread::GzDecoder<R>>),
    /// After one: another, the end, or bytes that are no member.
    Between(R),
    Done,
}

impl<R: BufRead> Read for GzipMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match &mut self.state {
                Gzip::Done => return Ok(0),
                Gzip::Member(decoder) => {
                    let n = decoder.read(buf)?;
                    if n > 0 || buf.is_empty() {
                        return Ok(n);
                    }
                    let Gzip::Member(decoder) = std::mem::replace(&mut self.state, Gzip::Done)
                    else {
                        unreachable!("matched a member")
                    };
                    self.state = Gzip::Between(decoder.into_inner());
                }
                Gzip::Between(rest) => {
                    // An error here leaves the state as it is: a read again retries.
                    let head = rest.fill_buf()?;
                    let another = match head {
                        [] => None,
                        [first, more @ ..] => Some(
                            *first == GZIP_MAGIC[0]
                                && more.first().is_none_or(|&b| b == GZIP_MAGIC[1]),
                        ),
                    };
                    match another {
                        None => self.state = Gzip::Done,
                        Some(true) => {
                            let Gzip::Between(rest) =
                                std::mem::replace(&mut self.state, Gzip::Done)
                            else {
                                unreachable!("matched between members")
                            };
                            self.state =
                                Gzip::Member(Box::new(flate2::bufread::GzDecoder::new(rest)));
                        }
                        Some(false) => {
                            eprintln!(
                                "warning: {}: what follows the last gzip member is not gzip; ignored",
                                self.name
                            );
                            self.state = Gzip::Done;
                        }
                    }
                }
            }
        }
    }
}

/// The events `replay` and `backtest` read.
enum Events {
    Reader(Box<dyn BufRead + Send>),
    Mapped(Arc<memmap2::Mmap>),
}

impl Events {
    fn input(&mut self) -> Input<'_> {
        match self {
            Events::Reader(reader) => Input::Reader(&mut **reader),
            Events::Mapped(map) => Input::Bytes(map.clone()),
        }
    }
}

/// The events of `path`: a plain file of events mapped into memory when `mmap` allows
/// (read in place, no copy), anything else read (standard input, `.gz`, OTLP JSON mapped
/// to events, a pipe or FIFO, an empty file, or a file the system does not map).
fn open_events(
    path: &Path,
    format: InputArg,
    config: &Config,
    mmap: bool,
) -> anyhow::Result<Events> {
    let plain = path != Path::new("-") && path.extension().is_none_or(|e| e != "gz");
    // Told apart before opening: a FIFO opened twice would lose its writer's data.
    let regular = || std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0);
    if mmap && plain && format != InputArg::OtlpJson && regular() {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: the map is only read, and the slices borrowed from it never outlive it
        // (the batches hold the `Arc`). What no read could do is the caller's risk, said
        // in `--no-mmap`'s help and the README: a file cut short or failing on disk while
        // mapped ends the process (SIGBUS), and one rewritten in place may change bytes
        // already checked (appending is harmless: the map ends at the size it had).
        if let Ok(map) = unsafe { memmap2::Mmap::map(&f) } {
            let _ = map.advise(memmap2::Advice::Sequential);
            let head = &map[..map.len().min(1 << 16)];
            let gzip = head.starts_with(&GZIP_MAGIC);
            if !gzip && (format == InputArg::Events || !looks_like_otlp_json(head)) {
                return Ok(Events::Mapped(Arc::new(map)));
            }
        }
    }
    Ok(Events::Reader(events_of(
        open_input(path)?,
        format,
        config,
    )?))
}

/// The input as event lines: OTLP JSON trace exports are mapped to events (reporting
/// bad lines and a summary on stderr), events pass through.
fn events_of(
    mut input: Box<dyn BufRead + Send>,
    format: InputArg,
    config: &Config,
) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let otlp = match format {
        InputArg::Events => false,
        InputArg::OtlpJson => true,
        InputArg::Auto => {
            // Read ahead to the first line that is not blank (a pipe's first read may
            // hold less), then the input is read whole again.
            let mut head = Vec::new();
            loop {
                let start = head.len();
                let n = (&mut input)
                    .take(1 << 16)
                    .read_until(b'\n', &mut head)
                    .context("cannot read the input")?;
                if n == 0 || !head[start..].trim_ascii().is_empty() || head.len() >= 1 << 16 {
                    break;
                }
            }
            let otlp = looks_like_otlp_json(&head);
            input = Box::new(BufReader::with_capacity(
                1 << 16,
                std::io::Cursor::new(head).chain(input),
            ));
            otlp
        }
    };
    if !otlp {
        return Ok(input);
    }
    let mapper = OtlpIngest::mapper(config.otlp_session_attribute.as_deref(), &config.limits);
    let lines = OtlpJsonLines::new(input, mapper, Box::new(std::io::stderr()));
    Ok(Box::new(BufReader::with_capacity(1 << 16, lines)))
}

/// Logs on stderr; RUST_LOG wins over `default_level`.
fn init_logs(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// SIGTERM / SIGINT trigger `shutdown`; a second signal exits at once.
fn on_signals(shutdown: Shutdown) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal runtime")?;
    // Registered before returning, so no signal falls into the default (kill) action.
    let (mut term, mut int) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            for _ in 0..2 {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                if shutdown.is_triggered() {
                    tracing::warn!(signal = name, "second signal: exiting now");
                    std::process::exit(130);
                }
                tracing::info!(signal = name, "shutting down");
                shutdown.trigger();
            }
        })
    });
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // The demo prints its own story on stdout; the pipeline's logs would drown it.
    let default_level = match cli.command {
        Command::Demo { .. } => "warn",
        _ => "info",
    };
    init_logs(cli.log_format, default_level);
    match cli.command {
        Command::Run { config } => {
            without_transparent_huge_pages();
            let config = load_config(config.as_deref())?;
            let shutdown = Shutdown::new();
            on_signals(shutdown.clone())?;
            let embedded;
            let brokers = match &config.kafka.brokers {
                Some(b) => b.clone(),
                None => {
                    let mut topics = config.kafka.all_topics();
                    if config.telemetry.spans_to_kafka {
                        topics.push(&config.telemetry.spans_topic);
                    }
                    if let Some(ingest) = &config.ingest {
                        topics.extend(ingest.topics.iter().map(String::as_str));
                    }
                    embedded = EmbeddedBroker::start(&topics, config.kafka.embedded_partitions)?;
                    let b = embedded.bootstrap_servers().to_string();
                    // One write, and a closed stdout is not fatal: whoever started us may
                    // read the address and hang up, and the service must keep running.
                    let banner = format!(
                        "embedded broker (in memory, for trying loopwarden out) listening on {b}\n\
                         produce events to {} with any Kafka client, e.g.\n  \
                         loopwarden simulate --brokers {b} --sessions 100 --rate 500\n",
                        config.kafka.input_topics.join(", ")
                    );
                    let mut stdout = std::io::stdout().lock();
                    if let Err(error) = stdout
                        .write_all(banner.as_bytes())
                        .and_then(|()| stdout.flush())
                    {
                        tracing::warn!(%error, "cannot print the embedded broker's address");
                    }
                    b
                }
            };
            let mut telemetry = Telemetry::new();
            telemetry.metrics =
                Metrics::with_owner_series_limit(config.telemetry.owner_series_limit);
            telemetry.spans = Spans::start(
                &config.telemetry,
                &config.kafka,
                &brokers,
                telemetry.metrics.spans_dropped.clone(),
            )?;
            let telemetry = Arc::new(telemetry);
            let http = match &config.telemetry.http_listen {
                Some(addr) => Some(http::serve(addr, telemetry.clone(), shutdown.clone())?),
                None => None,
            };
            let result =
                pipeline::run_observed(config, &brokers, shutdown.clone(), telemetry.clone());
            shutdown.trigger();
            if let Some(spans) = &telemetry.spans {
                spans.shutdown();
            }
            if let Some(server) = http {
                server.join();
            }
            let stats = result?;
            eprintln!(
                "processed {} events ({} skipped as already applied, {} dead-lettered): {} warnings, {} terminations, {} summaries",
                stats.events, stats.skipped, stats.dead_lettered, stats.warnings, stats.terminations, stats.summaries
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            config,
            sessions,
            rate,
            loop_share,
            seed,
        } => {
            let config = load_config(config.as_deref())?;
            let shutdown = Shutdown::new();
            on_signals(shutdown.clone())?;
            let options = DemoOptions {
                fleet: FleetSpec {
                    sessions,
                    concurrency: 60,
                    loop_share,
                    seed,
                },
                rate,
                settle: std::time::Duration::from_secs(30),
            };
            let stdout = std::io::stdout();
            let report = demo(config, options, &mut stdout.lock(), shutdown)?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate {
            config,
            brokers,
            topic,
            output,
            truth,
            sessions,
            concurrency,
            loop_share,
            rate,
            seed,
        } => {
            let config = load_config(config.as_deref())?;
            anyhow::ensure!(concurrency > 0, "--concurrency must be > 0");
            let mut fleet = Fleet::new(FleetSpec {
                sessions,
                concurrency,
                loop_share,
                seed,
            });
            let shutdown = Shutdown::new();
            on_signals(shutdown.clone())?;
            let report = match (brokers, output) {
                (Some(brokers), _) => {
                    let producer: FeedProducer = kafka::producer_config(
                        &config.kafka,
                        &brokers,
                        config.limits.max_event_bytes,
                    )
                    .create_with_context(Default::default())
                    .context("cannot create the producer")?;
                    let routing = match topic {
                        Some(t) => Routing::single(&t),
                        None => Routing::for_inputs(&config.kafka.input_topics),
                    };
                    feed(
                        &mut fleet,
                        Target::Kafka {
                            producer: &producer,
                            routing,
                        },
                        rate,
                        None,
                        None,
                        &shutdown,
                    )?
                }
                (None, Some(path)) => {
                    let mut w: Box<dyn Write> = if path == Path::new("-") {
                        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
                    } else {
                        Box::new(std::io::BufWriter::new(
                            std::fs::File::create(&path)
                                .with_context(|| format!("cannot create {}", path.display()))?,
                        ))
                    };
                    feed(
                        &mut fleet,
                        Target::Lines(&mut *w),
                        rate,
                        Some(FILE_CLOCK),
                        None,
                        &shutdown,
                    )?
                }
                (None, None) => anyhow::bail!("say where the events go: --brokers or --output"),
            };
            if let Some(path) = truth {
                let mut f = std::io::BufWriter::new(
                    std::fs::File::create(&path)
                        .with_context(|| format!("cannot create {}", path.display()))?,
                );
                write_truth(fleet.truths(), &mut f)?;
            }
            eprintln!(
                "simulated {} events of {} sessions",
                report.events, report.sessions
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay {
            input,
            config,
            format,
            strict,
            threads,
            input_format,
            no_mmap,
        } => {
            let config = load_config(config.as_deref())?;
            let mut events = open_events(&input, input_format, &config, !no_mmap)?;
            let options = ReplayOptions {
                threads: threads_or_cores(threads)?,
                strict,
                ..ReplayOptions::default()
            };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            let mut err = std::io::stderr();
            let format = match format {
                FormatArg::Json => Format::Json,
                FormatArg::Table => Format::Table,
            };
            let report = replay(config, events.input(), &mut out, &mut err, format, options)?;
            drop(out);
            eprintln!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Backtest {
            input,
            config,
            outcomes,
            format,
            threads,
            input_format,
            no_mmap,
        } => {
            let config = load_config(config.as_deref())?;
            let is_stdin = |p: &Path| {
                p == Path::new("-")
                    || p == Path::new("/dev/stdin")
                    || p == Path::new("/proc/self/fd/0")
            };
            if is_stdin(&input) && outcomes.as_deref().is_some_and(is_stdin) {
                anyhow::bail!("the events and --outcomes cannot both be read from standard input");
            }
            let outcomes = match outcomes {
                Some(path) => Outcomes::read(&mut *open_input(&path)?)
                    .with_context(|| format!("in {}", path.display()))?,
                None => Outcomes::default(),
            };
            let mut events = open_events(&input, input_format, &config, !no_mmap)?;
            let threads = threads_or_cores(threads)?;
            let report = backtest(
                config,
                events.input(),
                &outcomes,
                &mut std::io::stderr(),
                threads,
            )?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match format {
                FormatArg::Table => report.write_table(&mut out)?,
                FormatArg::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval {
            corpus,
            config,
            verbose,
        } => {
            let config = load_config(config.as_deref())?;
            let mut reader = open_input(&corpus)?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let totals = run_corpus(&config, &mut reader, |r| {
                let _ = match r {
                    Ok(c) if c.held => writeln!(out, "held    {}", c.id),
                    Ok(c) => writeln!(out, "FAILED  {}: {}", c.id, c.failures.join("; ")),
                    Err((line, ref e)) => writeln!(out, "UNREADABLE line {line}: {e}"),
                };
                if verbose {
                    if let Ok(c) = r {
                        for (at, det, level) in &c.findings {
                            let _ = writeln!(out, "          event {at}: {det} {}", level.name());
                        }
                    }
                }
            })?;
            writeln!(out, "{totals}")?;
            Ok(if totals.held == totals.cases && totals.bad_lines == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Healthcheck { url, timeout_secs } => {
            let agent = ureq::AgentBuilder::new()
                .timeout(std::time::Duration::from_secs(timeout_secs))
                .build();
            // ureq reports a non-2xx answer as an error carrying the response.
            match agent.get(&url).call() {
                Ok(response) => {
                    println!("{} {url}", response.status());
                    Ok(ExitCode::SUCCESS)
                }
                Err(ureq::Error::Status(code, response)) => {
                    let body = response.into_string().unwrap_or_default();
                    eprintln!("{code} {url}: {}", body.trim());
                    Ok(ExitCode::from(1))
                }
                Err(error) => {
                    eprintln!("{url}: {error}");
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::CheckConfig { file, config } => {
            let config = load_config(file.or(config).as_deref())?;
            print!("{}", config.effective_toml());
            eprintln!("configuration is valid");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The variables the command line reads (clap's `env`): set but empty, they are taken as
/// unset, as a deployment template that leaves one blank means (clap would refuse the
/// empty value of every command).
const COMMAND_LINE_ENV: [&str; 3] = [
    "LOOPWARDEN_CONFIG",
    "LOOPWARDEN_LOG_FORMAT",
    "LOOPWARDEN_THREADS",
];

/// `loopwarden run` is a long-lived service whose resident memory must stay flat.
/// mimalloc asks the kernel for transparent huge pages by default, and a heap spread over
/// 2 MiB pages stays resident page by page: in the soak (issue 28) the first member's
/// RSS rose from 71 MB after 5 minutes to over 100 MB within 40 minutes with huge pages,
/// its heap being about 20 MB, and stayed between 27 and 38 MB without them (20- and
/// 45-minute runs). So the service opts out (`PR_SET_THP_DISABLE`, what
/// `MIMALLOC_ALLOW_THP=0` does); the batch commands keep huge pages for speed. Setting `MIMALLOC_ALLOW_THP` (to 1) leaves the choice to mimalloc.
fn without_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes nothing but
        // this process's use of huge pages.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot turn transparent huge pages off: resident memory may grow with the heap's spread"
            );
        }
    }
}

fn main() -> ExitCode {
    for name in COMMAND_LINE_ENV {
        if std::env::var_os(name).is_some_and(|v| v.is_empty()) {
            // Before any other thread exists: nothing reads the environment meanwhile.
            std::env::remove_var(name);
        }
    }
    let cli = Cli::parse();
    // Test builds only: crash points armed through the FAILPOINTS environment variable.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(2)
        }
    }
}

/// An error and its causes on one line, each cause said once: many errors name their
/// cause in their own message already (`{e:#}` would say it twice).
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("kafka client: {0}")]
        struct Wrapping(#[from] std::io::Error);
        let io = || std::io::Error::other("broker down");
        let e = anyhow::Error::from(Wrapping(io())).context("cannot start");
        assert_eq!(error_chain(&e), "cannot start: kafka client: broker down");
        let plain = anyhow::Error::from(io()).context("cannot read x");
        assert_eq!(error_chain(&plain), "cannot read x: broker down");
    }

    fn opened(path: &Path, format: InputArg, mmap: bool) -> &'static str {
        match open_events(path, format, &Config::default(), mmap).unwrap() {
            Events::Mapped(_) => "mapped",
            Events::Reader(_) => "read",
        }
    }

    #[test]
    fn threads_are_one_to_the_most_a_drive_takes() {
        assert_eq!(threads_or_cores(Some(3)).unwrap(), 3);
        let max = loopwarden::driver::MAX_THREADS;
        assert_eq!(threads_or_cores(Some(max)).unwrap(), max);
        for bad in [0, max + 1, 100_000] {
            assert!(threads_or_cores(Some(bad)).is_err(), "{bad}");
        }
        let cores = threads_or_cores(None).unwrap();
        assert!((1..=max).contains(&cores), "{cores}");
    }

    #[test]
    fn the_environment_is_read_without_panicking_on_bytes_that_are_not_utf8() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let var = |name: &[u8], value: &[u8]| {
            (
                OsString::from_vec(name.to_vec()),
                OsString::from_vec(value.to_vec()),
            )
        };
        // Someone else's variable that is not UTF-8: passed over.
        let env = config_env(
            [
                var(b"X", b"\xff"),
                var(b"\xfe", b"1"),
                var(b"LOOPWARDEN_MODE", b"warn"),
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(env, vec![("LOOPWARDEN_MODE".into(), "warn".into())]);
        // Ours: an error that names it.
        let err = config_env([var(b"LOOPWARDEN_MODE", b"w\xffrn")].into_iter()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable LOOPWARDEN_MODE: its value is not UTF-8"
        );
        let err = config_env([var(b"LOOPWARDEN_\xff", b"1")].into_iter()).unwrap_err();
        assert!(err.to_string().contains("its name is not UTF-8"), "{err}");
        // A reserved variable naming a path that is not UTF-8: none of the config's.
        let env =
            config_env([var(b"LOOPWARDEN_CONFIG", b"/etc/caf\xe9.toml")].into_iter()).unwrap();
        assert!(env.is_empty(), "{env:?}");
    }

    #[test]
    fn a_plain_file_of_events_is_mapped_anything_else_read() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        std::fs::write(&events, "{\"type\": \"session.started\"}\n").unwrap();
        let otlp = dir.path().join("traces.jsonl");
        std::fs::write(&otlp, "{\"resourceSpans\": []}\n").unwrap();
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let gz = dir.path().join("events.jsonl.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        encoder.write_all(b"{}\n").unwrap();
        std::fs::write(&gz, encoder.finish().unwrap()).unwrap();

        assert_eq!(opened(&events, InputArg::Auto, true), "mapped");
        assert_eq!(opened(&events, InputArg::Events, true), "mapped");
        assert_eq!(opened(&events, InputArg::Auto, false), "read", "--no-mmap");
        assert_eq!(
            opened(&otlp, InputArg::Auto, true),
            "read",
            "OTLP is mapped to events"
        );
        assert_eq!(
            opened(&otlp, InputArg::Events, true),
            "mapped",
            "said to be events"
        );
        assert_eq!(opened(&empty, InputArg::Auto, true), "read");
        assert_eq!(opened(&gz, InputArg::Auto, true), "read");
        assert!(open_events(
            &dir.path().join("missing"),
            InputArg::Auto,
            &Config::default(),
            true
        )
        .is_err());
    }

    /// Gzip is told by its bytes, not its name (a `.log` that is gzip, or standard
    /// input), and OTLP JSON by its first line that is not blank.
    #[test]
    fn gzip_and_otlp_are_told_by_their_content() {
        let read_all = |path: &Path, mmap: bool| {
            let mut events = open_events(path, InputArg::Auto, &Config::default(), mmap).unwrap();
            match events.input() {
                Input::Reader(reader) => {
                    let mut text = String::new();
                    reader.read_to_string(&mut text).unwrap();
                    text
                }
                Input::Bytes(bytes) => String::from_utf8((*bytes).as_ref().to_vec()).unwrap(),
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let lines = "{\"type\": \"session.started\", \"session_id\": \"s\"}\n".repeat(3);
        let gz = dir.path().join("events.log");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        encoder.write_all(lines.as_bytes()).unwrap();
        std::fs::write(&gz, encoder.finish().unwrap()).unwrap();
        assert_eq!(opened(&gz, InputArg::Auto, true), "read");
        assert_eq!(read_all(&gz, true), lines);
        assert_eq!(read_all(&gz, false), lines);
        // One byte, and a file that is not gzip past its first byte: read as it is.
        for text in ["x", "\u{1f}{}\n"] {
            let odd = dir.path().join("odd.jsonl");
            std::fs::write(&odd, text).unwrap();
            assert_eq!(read_all(&odd, false), text);
        }
        let otlp = dir.path().join("traces.jsonl");
        std::fs::write(&otlp, "\n  \r\n{\"resourceSpans\": []}\n").unwrap();
        assert_eq!(
            opened(&otlp, InputArg::Auto, true),
            "read",
            "mapped to events"
        );
        assert_eq!(read_all(&otlp, false), "", "no spans, no events");
    }

    /// Gzip members are read one after another, and bytes after the last that are no
    /// member end the input (as `gzip -d` has it), where a corrupt member fails it.
    #[test]
    fn gzip_members_are_read_in_turn_and_trailing_bytes_ignored() {
        let member = |text: &str| {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
            encoder.write_all(text.as_bytes()).unwrap();
            encoder.finish().unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let read_all = |bytes: &[u8]| {
            let path = dir.path().join("events.jsonl.gz");
            std::fs::write(&path, bytes).unwrap();
            let mut text = String::new();
            open_input(&path)?.read_to_string(&mut text)?;
            anyhow::Ok(text)
        };
        let two = [member("{\"a\": 1}\n"), member("{\"b\": 2}\n")].concat();
        assert_eq!(read_all(&two).unwrap(), "{\"a\": 1}\n{\"b\": 2}\n");
        for trailing in [&[0u8; 100][..], b"garbage\n"] {
            let padded = [&two[..], trailing].concat();
            assert_eq!(read_all(&padded).unwrap(), "{\"a\": 1}\n{\"b\": 2}\n");
        }
        // A second member cut short is an error, not an end.
        let cut = [&two[..], &member("{\"c\": 3}\n")[..12]].concat();
        assert!(read_all(&cut).is_err());
    }

    /// A FIFO is read, not mapped, and its writer's data all arrives (`open_events`
    /// tells it apart by `stat`, without opening it: a FIFO opened, closed and opened
    /// again may lose what its writer wrote between, or wait for a writer that has gone).
    #[test]
    fn a_fifo_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("events.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let lines: String = (0..1000).map(|i| format!("{{\"n\": {i}}}\n")).collect();
        let writer = {
            let (fifo, lines) = (fifo.clone(), lines.clone());
            // Opening for writing waits for the reader; written, then closed.
            std::thread::spawn(move || std::fs::write(fifo, lines).unwrap())
        };
        // Read on a thread of its own, so that a read that waits for a writer that has
        // gone fails the test on the timeout instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut events = open_events(&fifo, InputArg::Auto, &Config::default(), true)?;
            let Input::Reader(reader) = events.input() else {
                anyhow::bail!("a FIFO cannot be mapped")
            };
            let mut got = String::new();
            reader.read_to_string(&mut got)?;
            tx.send(got)?;
            Ok(())
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the FIFO read to its end");
        writer.join().unwrap();
        assert_eq!(got, lines);
    }
}
