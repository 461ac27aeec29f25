//! The command line (§1): parsing, then handing over to the right part of the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, LogFormat, RawFlags, Settings};

/// Exit status for a bad flag, value or config file.
pub const EXIT_USAGE: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "fulcrum",
    version,
    about = "An HTTP load balancer and reverse proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the load balancer.
    Serve(Box<ServeArgs>),
    /// Run the demo: spawned backends with different latencies plus the balancer.
    Demo(DemoArgs),
    /// Run a demo backend.
    Backend(BackendArgs),
    /// Validate a config file and exit 0 (valid) or 2 (invalid).
    Check(CheckArgs),
}

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
struct ServeArgs {
    /// TOML config file; flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Proxy listener [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Admin API listener [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Backend `URL[,weight=N][,name=NAME]`; repeatable.
    #[arg(long, value_name = "SPEC")]
    backend: Vec<String>,
    /// Balancing strategy [default: round_robin].
    #[arg(long, value_name = "NAME")]
    strategy: Option<String>,
    /// Key of the hashing strategies: client_ip, header:NAME, cookie:NAME [default: client_ip].
    #[arg(long, value_name = "KEY")]
    hash_key: Option<String>,
    /// Peers whose X-Forwarded-For is believed, CIDR[,CIDR…].
    #[arg(long, value_name = "CIDRS")]
    trusted_proxies: Option<String>,
    /// Bounded load for the hashing strategies: a backend may hold at most F times its share of the requests in flight, F > 1; 0 = off [default: 0].
    #[arg(long, value_name = "F")]
    hash_balance_factor: Option<String>,
    /// Active health check path [default: /health].
    #[arg(long, value_name = "PATH")]
    health_path: Option<String>,
    /// Time between health probes [default: 5s].
    #[arg(long, value_name = "DUR")]
    health_interval: Option<String>,
    /// Bound on one health probe [default: 2s].
    #[arg(long, value_name = "DUR")]
    health_timeout: Option<String>,
    /// Consecutive successes to become healthy [default: 2].
    #[arg(long, value_name = "N")]
    healthy_threshold: Option<String>,
    /// Consecutive failures to become unhealthy [default: 3].
    #[arg(long, value_name = "N")]
    unhealthy_threshold: Option<String>,
    /// TCP connect bound [default: 3s].
    #[arg(long, value_name = "DUR")]
    connect_timeout: Option<String>,
    /// Request sent → response headers bound, then 504 [default: 30s].
    #[arg(long, value_name = "DUR")]
    upstream_timeout: Option<String>,
    /// Extra attempts for a failed idempotent request [default: 2].
    #[arg(long, value_name = "N")]
    retries: Option<String>,
    /// Above N requests in flight answer 503 at once; 0 = off [default: 0].
    #[arg(long, value_name = "N")]
    max_inflight: Option<String>,
    /// Weight ramp for joining backends [default: 0s].
    #[arg(long, value_name = "DUR")]
    slow_start: Option<String>,
    /// Smoothing factor of the latency average, 0 < F <= 1 [default: 0.1].
    #[arg(long, value_name = "F")]
    ewma_alpha: Option<String>,
    /// File holding the admin bearer token.
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Threads serving traffic [default: number of CPU cores].
    #[arg(long, value_name = "N")]
    workers: Option<String>,
    /// Log format on stderr: text or json [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// One access log line per request on stderr: on or off [default: on].
    #[arg(long, value_name = "on|off")]
    access_log: Option<String>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Proxy listener.
    #[arg(long, value_name = "ADDR", default_value = config::DEFAULT_LISTEN)]
    listen: String,
    /// Admin API listener.
    #[arg(long, value_name = "ADDR", default_value = config::DEFAULT_ADMIN)]
    admin: String,
    /// Number of demo backends.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    backends: u16,
    /// Balancing strategy.
    #[arg(long, value_name = "NAME", default_value = "round_robin")]
    strategy: String,
}

#[derive(Args, Debug)]
struct BackendArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Name reported in every answer [default: the listen address].
    #[arg(long)]
    name: Option<String>,
    /// Latency of every answer, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    latency_ms: u64,
    /// Uniform jitter around the latency, ± milliseconds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    jitter_ms: u64,
    /// Share of requests answered with 500, 0..=1.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    error_rate: f64,
    /// Serve on this already-bound listening socket instead of binding --listen (used
    /// by fulcrum for the backends it spawns).
    #[arg(long, value_name = "FD", hide = true)]
    listen_fd: Option<i32>,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The config file to validate.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

impl ServeArgs {
    fn into_raw(self) -> RawFlags {
        RawFlags {
            config: self.config,
            listen: self.listen,
            admin: self.admin,
            backend: self.backend,
            strategy: self.strategy,
            hash_key: self.hash_key,
            trusted_proxies: self.trusted_proxies,
            hash_balance_factor: self.hash_balance_factor,
            health_path: self.health_path,
            health_interval: self.health_interval,
            health_timeout: self.health_timeout,
            healthy_threshold: self.healthy_threshold,
            unhealthy_threshold: self.unhealthy_threshold,
            connect_timeout: self.connect_timeout,
            upstream_timeout: self.upstream_timeout,
            retries: self.retries,
            max_inflight: self.max_inflight,
            slow_start: self.slow_start,
            ewma_alpha: self.ewma_alpha,
            admin_token_file: self.admin_token_file,
            admin_token_env: std::env::var("FULCRUM_ADMIN_TOKEN").ok(),
            workers: self.workers,
            log_format: self.log_format,
            access_log: self.access_log,
        }
    }
}

fn usage_error(msg: impl std::fmt::Display) -> i32 {
    eprintln!("error: {msg}");
    EXIT_USAGE
}

fn init_logging(format: LogFormat) {
    crate::logging::init(format);
}

/// Parses the command line and runs; returns the process exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    EXIT_USAGE
                } else {
                    0
                };
            }
            // One line: clap's first line names the flag and the value.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid command line");
            eprintln!("{first}");
            return EXIT_USAGE;
        }
    };
    match cli.command {
        Command::Serve(args) => serve((*args).into_raw()),
        Command::Check(args) => check(&args.config),
        Command::Backend(args) => backend(args),
        Command::Demo(args) => demo(args),
    }
}

fn serve(flags: RawFlags) -> i32 {
    let settings = match config::build(&flags) {
        Ok(s) => s,
        Err(errors) => return usage_error(&errors[0]),
    };
    init_logging(settings.log_format);
    run_until_signal(&settings, &flags, |_| Ok(()), || ())
}

/// Starts the balancer, calls `started`, waits for SIGTERM/SIGINT, drains, then runs
/// `after`.
fn run_until_signal(
    settings: &Settings,
    flags: &RawFlags,
    started: impl FnOnce(&crate::server::Running) -> Result<(), String>,
    after: impl FnOnce(),
) -> i32 {
    let signals = match crate::server::Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot install signal handlers: {e}");
            return 1;
        }
    };
    let running = match crate::server::start(settings, flags) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            after();
            return 1;
        }
    };
    if let Err(e) = started(&running) {
        eprintln!("error: {e}");
        running.stop();
        after();
        return 1;
    }
    let reloader = Arc::clone(&running.reloader);
    signals.wait(move || {
        if let Err(e) = reloader.reload() {
            tracing::error!("{e}; the running configuration stays");
        }
    });
    running.stop();
    after();
    tracing::info!("stopped");
    0
}

fn check(path: &std::path::Path) -> i32 {
    let errors = config::check_file(path);
    if errors.is_empty() {
        println!("{}: ok", path.display());
        0
    } else {
        for e in &errors {
            eprintln!("error: {e}");
        }
        EXIT_USAGE
    }
}

fn backend(args: BackendArgs) -> i32 {
    let addr: SocketAddr = match config::parse_addr(&args.listen) {
        Ok(a) => a,
        Err(e) => return usage_error(format!("--listen: {e}")),
    };
    if !(0.0..=1.0).contains(&args.error_rate) {
        return usage_error(format!(
            "--error-rate: invalid value '{}' (expected a number from 0 to 1)",
            args.error_rate
        ));
    }
    init_logging(LogFormat::Text);
    let opts = crate::demo::backend::BackendOptions {
        name: args.name.unwrap_or_else(|| addr.to_string()),
        latency_ms: args.latency_ms,
        jitter_ms: args.jitter_ms,
        error_rate: args.error_rate,
    };
    let listener = match args.listen_fd {
        Some(fd) if fd > 2 => {
            use std::os::fd::FromRawFd;
            // SAFETY: the parent passed a bound, listening socket on this descriptor,
            // and nothing else in this process owns it.
            let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            if let Err(e) = l.set_nonblocking(true) {
                eprintln!("error: --listen-fd {fd}: {e}");
                return 1;
            }
            l
        }
        Some(fd) => {
            return usage_error(format!(
                "--listen-fd: invalid value '{fd}' (expected 3 or more)"
            ))
        }
        None => match crate::server::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: cannot listen on {addr}: {e}");
                return 1;
            }
        },
    };
    match crate::demo::backend::serve_blocking(listener, opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn demo(args: DemoArgs) -> i32 {
    let flags = RawFlags {
        listen: Some(args.listen),
        admin: Some(args.admin),
        strategy: Some(args.strategy),
        health_interval: Some("1s".into()),
        health_timeout: Some("500ms".into()),
        admin_token_env: std::env::var("FULCRUM_ADMIN_TOKEN").ok(),
        // The dashboard shows the traffic; a line per request would flood the terminal.
        access_log: Some("off".into()),
        ..Default::default()
    };
    let settings = match config::build(&flags) {
        Ok(s) => s,
        Err(errors) => return usage_error(&errors[0]),
    };
    init_logging(settings.log_format);
    let n = args.backends as usize;
    let started = move |r: &crate::server::Running| -> Result<(), String> {
        let mut lines = Vec::new();
        for i in 0..n {
            let (name, latency_ms) = crate::demo::backend_plan(i);
            let req = crate::spawn::SpawnRequest {
                weight: None,
                latency_ms,
                name: Some(name),
            };
            let b = r
                .admin_rt
                .block_on(r.spawner.spawn(req))
                .map_err(|e| format!("demo backend: {e}"))?;
            lines.push(format!(
                "  backend: {} at {} ({} ms)",
                b.name, b.url, latency_ms
            ));
        }
        let plan = crate::traffic::Plan {
            rps: crate::demo::DEMO_RPS,
            seconds: crate::traffic::MAX_SECONDS,
            path: "/".into(),
        };
        r.admin_rt
            .block_on(async { r.traffic.start(plan) })
            .map_err(|_| "traffic generator busy".to_string())?;
        println!("fulcrum demo");
        println!("  dashboard: http://{}/", r.admin);
        println!("  proxy:     http://{}/", r.listen);
        println!("  admin:     http://{}/admin/status", r.admin);
        for l in &lines {
            println!("{l}");
        }
        println!(
            "  traffic:   {} requests/s through the proxy for {} minutes",
            crate::demo::DEMO_RPS,
            crate::traffic::MAX_SECONDS / 60
        );
        println!("Ctrl-C stops everything.");
        Ok(())
    };
    run_until_signal(&settings, &flags, started, || ())
}
