//! The command line (`docs/configuration.md`): parsing, then handing over to the right part of the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, LogFormat, RawFlags, Settings};

/// Exit status for a bad flag, value or config file.
pub(crate) const EXIT_USAGE: i32 = 2;

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
    /// Compare the strategies on one scripted workload (docs/lab.md).
    Lab(LabArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page (roff) of fulcrum and every subcommand.
    Manpage,
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL")]
    shell: clap_complete::Shell,
}

/// The whole command line's definition, as clap has it (for the man page and the
/// completions, made from it so they cannot disagree with it).
fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

#[derive(Args, Debug)]
struct LabArgs {
    /// slow-backend, flapping, heterogeneous, warmup, hot-key, overload, brownout or
    /// long-lived (a TCP pool).
    #[arg(long, value_name = "NAME")]
    scenario: String,
    /// `all`, or strategy names separated by commas; a name may end in `+bounded`,
    /// `+auto`, `+unlimited` or `+success_rate` (docs/lab.md, "Rows").
    #[arg(long, value_name = "all|NAME,…", default_value = "all")]
    strategies: String,
    /// Seconds of load per strategy (at most 120).
    #[arg(long, value_name = "N", default_value_t = crate::lab::DEFAULT_SECONDS)]
    seconds: u32,
    /// Requests per second offered [default: the scenario's].
    #[arg(long, value_name = "N")]
    rps: Option<u32>,
    /// Seed of the schedule: the same seed sends the same requests at the same times.
    #[arg(long, value_name = "N", default_value_t = crate::lab::DEFAULT_SEED)]
    seed: u64,
    /// Also write the report as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Progress as one JSON object per line on stderr, for programs.
    #[arg(long)]
    progress_json: bool,
    /// Also write the chart as SVG here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// `fulcrum serve`'s flags: `--config`, the repeatable `--backend`, and one flag per
/// row of the options table (`config::options`), made from it.
#[derive(Debug)]
struct ServeArgs(RawFlags);

impl clap::FromArgMatches for ServeArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = RawFlags {
            config: m.get_one::<PathBuf>("config").cloned(),
            backend: m
                .get_many::<String>("backend")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
            discover: m.get_one::<String>("discover").cloned(),
            values: Vec::new(),
            admin_token_env: std::env::var("FULCRUM_ADMIN_TOKEN").ok(),
            upgrade: m.get_flag("upgrade"),
        };
        for o in config::options::OPTIONS {
            if let Some(v) = m.get_one::<String>(o.key) {
                flags.values.push((o.key, v.clone()));
            }
        }
        Ok(ServeArgs(flags))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        let mut cmd = cmd.allow_negative_numbers(true).arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML config file; flags override it"),
        );
        cmd = cmd.arg(
            Arg::new("upgrade")
                .long("upgrade")
                .action(ArgAction::SetTrue)
                .help("Take the listening sockets over from the fulcrum at --upgrade-socket, which then drains and exits"),
        );
        for o in config::options::OPTIONS {
            // clap keeps `&'static str` names; the table has the snake_case key, so the
            // kebab-case flag is made once per process.
            let long: &'static str = Box::leak(o.flag().into_boxed_str());
            cmd = cmd.arg(
                Arg::new(o.key)
                    .long(long)
                    .value_name(o.value_name)
                    .value_parser(crate::manual::Offered::for_option(o))
                    .help(o.help_line()),
            );
            if o.key == "admin" {
                cmd = cmd.arg(
                    Arg::new("backend")
                        .long("backend")
                        .value_name("SPEC")
                        .action(ArgAction::Append)
                        .help("Backend `URL[,weight=N][,name=NAME]`; repeatable"),
                );
                cmd = cmd.arg(
                    Arg::new("discover")
                        .long("discover")
                        .value_name("KIND=TARGET")
                        .help("Find the first pool's backends: srv=NAME, dns=NAME:PORT or file=PATH, then [,scheme=https][,interval=DUR]"),
                );
            }
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
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
    /// Serve the proxy over HTTPS too, with a self-signed certificate made at start.
    #[arg(long)]
    tls: bool,
    /// HTTPS listener with --tls.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8443")]
    tls_listen: String,
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
    /// At most N requests served at once; the others wait inside the backend.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_concurrency: Option<u32>,
    /// From this long after start on, every answer is --slow-factor times slower.
    #[arg(long, value_name = "DUR", value_parser = backend_duration)]
    slow_after: Option<std::time::Duration>,
    /// How much slower after --slow-after.
    #[arg(long, value_name = "F", default_value_t = 10.0)]
    slow_factor: f64,
    /// Failure bursts: the first half of every period this long is answered 500.
    #[arg(long, value_name = "DUR", value_parser = backend_duration)]
    fail_bursts: Option<std::time::Duration>,
    /// A cold start: ten times slower at start, back to normal over this long.
    #[arg(long, value_name = "DUR", value_parser = backend_duration)]
    cold_for: Option<std::time::Duration>,
    /// A brownout: from this long after start on, a third of the answers are 503, at once.
    #[arg(long, value_name = "DUR", value_parser = backend_duration)]
    brownout_after: Option<std::time::Duration>,
    /// Start the script's clock (--slow-after, --fail-bursts, --cold-for,
    /// --brownout-after) when a line arrives on stdin instead of at start.
    #[arg(long)]
    clock_on_stdin: bool,
    /// Report its load in every answer (`endpoint-load-metrics`: utilization = requests
    /// in flight ÷ its concurrency, averaged over the last second, and requests per
    /// second).
    #[arg(long)]
    report_load: bool,
    /// Serve a TCP line protocol instead of HTTP: each line is a query, answered with
    /// the name after the latency, which grows with the connections held open.
    #[arg(long)]
    tcp: bool,
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

/// A duration of `fulcrum backend`'s script (`500ms`, `5s`), greater than zero.
fn backend_duration(s: &str) -> Result<std::time::Duration, String> {
    config::parse_positive_duration(s)
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
            // One line: clap's first line names the flag and the value; for a missing
            // argument, the argument is on the next line.
            let text = e.render().to_string();
            let mut lines = text.lines();
            let first = lines.next().unwrap_or("invalid command line");
            match (e.kind(), lines.next()) {
                (ErrorKind::MissingRequiredArgument, Some(arg)) => {
                    eprintln!("{first} {}", arg.trim())
                }
                _ => eprintln!("{first}"),
            }
            return EXIT_USAGE;
        }
    };
    match cli.command {
        Command::Serve(args) => serve(args.0),
        Command::Check(args) => check(&args.config),
        Command::Backend(args) => backend(args),
        Command::Demo(args) => demo(args),
        Command::Lab(args) => lab(args),
        Command::Completions(args) => crate::manual::completions(args.shell, command()),
        Command::Manpage => crate::manual::manpage(command()),
    }
}

fn lab(args: LabArgs) -> i32 {
    let plan = match crate::lab::Plan::new(
        &args.scenario,
        &args.strategies,
        args.seconds,
        args.rps,
        args.seed,
    ) {
        Ok(p) => p,
        Err(e) => return usage_error(e),
    };
    eprintln!(
        "lab: {} at {} requests/s for {} s per strategy, {} strategies, seed {}",
        plan.scenario.name(),
        plan.rps,
        plan.seconds,
        plan.variants.len(),
        plan.seed
    );
    let mut progress = |p: &crate::lab::Progress| lab_progress(p, args.progress_json, plan.seconds);
    if let Err(e) = crate::lab::stop_on_signals() {
        eprintln!("error: {e}");
        return 1;
    }
    let report = match crate::lab_run::run(&plan, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("\nerror: {e}");
            return 1;
        }
    };
    eprintln!();
    print!("{}", crate::lab::report::table(&report));
    if let Err(e) = lab_outputs(&args, &report) {
        eprintln!("error: {e}");
        return 1;
    }
    lab_status(&plan, &report)
}

/// One progress report of the lab: a line redrawn in place, or a JSON line.
fn lab_progress(p: &crate::lab::Progress, json: bool, seconds: u32) {
    use std::io::Write as _;
    if json {
        eprintln!("{}", serde_json::to_string(p).unwrap_or_default());
        return;
    }
    eprint!(
        "\r[{}/{}] {:<26} {:<8} {:>5.1} / {seconds} s ",
        p.index + 1,
        p.of,
        p.strategy,
        p.phase.name(),
        p.elapsed,
    );
    let _ = std::io::stderr().flush();
}

/// Writes the report to `--json` and the chart to `--svg`, where asked.
fn lab_outputs(args: &LabArgs, report: &crate::lab::report::Report) -> Result<(), String> {
    if let Some(p) = &args.json {
        let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        crate::lab::write_file(p, &json)?;
    }
    if let Some(p) = &args.svg {
        crate::lab::write_file(p, &crate::lab::report::svg(report))?;
    }
    Ok(())
}

/// The lab's exit status: 1, saying why, when it was stopped or a strategy failed.
fn lab_status(plan: &crate::lab::Plan, report: &crate::lab::report::Report) -> i32 {
    let failed: Vec<String> = report
        .results
        .iter()
        .filter_map(|r| Some(format!("{}: {}", r.strategy, r.error.as_ref()?)))
        .collect();
    if crate::lab::stopping() {
        eprintln!(
            "error: stopped after {} of {} strategies",
            report.results.len(),
            plan.variants.len()
        );
        1
    } else if failed.is_empty() {
        0
    } else {
        eprintln!("error: a strategy's run failed: {}", failed.join("; "));
        1
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
            // A taken port, a refused hand-over: the settings do not fit this machine.
            eprintln!("error: {e}");
            after();
            return EXIT_USAGE;
        }
    };
    if let Err(e) = started(&running) {
        eprintln!("error: {e}");
        running.stop();
        after();
        return 1;
    }
    let reloader = Arc::clone(&running.reloader);
    let upgraded = running.upgraded.clone();
    signals.wait(
        move || {
            if let Err(e) = reloader.reload() {
                tracing::error!("{e}; the running configuration stays");
            }
        },
        upgraded,
    );
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
    if !(1.0..=1000.0).contains(&args.slow_factor) {
        return usage_error(format!(
            "--slow-factor: invalid value '{}' (expected a number from 1 to 1000)",
            args.slow_factor
        ));
    }
    init_logging(LogFormat::Text);
    let opts = crate::demo::backend::BackendOptions {
        name: args.name.unwrap_or_else(|| addr.to_string()),
        latency_ms: args.latency_ms,
        jitter_ms: args.jitter_ms,
        error_rate: args.error_rate,
        script: crate::demo::backend::Script {
            max_concurrency: args.max_concurrency.map(|n| n as usize),
            slow_after: args.slow_after,
            slow_factor: args.slow_factor,
            fail_bursts: args.fail_bursts,
            cold_for: args.cold_for,
            brownout_after: args.brownout_after,
            clock_on_stdin: args.clock_on_stdin,
        },
        report_load: args.report_load,
        tcp: args.tcp,
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
        None => match crate::listeners::bind(addr) {
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
        admin_token_env: std::env::var("FULCRUM_ADMIN_TOKEN").ok(),
        ..Default::default()
    }
    .with("listen", args.listen)
    .with("admin", args.admin)
    .with("strategy", args.strategy)
    .with("health_interval", "1s")
    .with("health_timeout", "500ms")
    // The dashboard shows the traffic; a line per request would flood the terminal.
    .with("access_log", "off");
    let (flags, certificate) = match args.tls {
        true => match crate::demo::self_signed() {
            Ok(c) => (
                flags
                    .with("tls_listen", args.tls_listen)
                    .with("tls_cert", c.cert.display().to_string())
                    .with("tls_key", c.key.display().to_string()),
                Some(c),
            ),
            Err(e) => {
                eprintln!("error: --tls: {e}");
                return 1;
            }
        },
        false => (flags, None),
    };
    let mut settings = match config::build(&flags) {
        Ok(s) => s,
        Err(errors) => return usage_error(&errors[0]),
    };
    crate::demo::lay_out(&mut settings);
    init_logging(settings.log_format);
    let n = args.backends as usize;
    let started = move |r: &crate::server::Running| -> Result<(), String> {
        let lines = crate::demo::spawn_backends(r, n)?;
        let (path, more_paths) = crate::demo::traffic_paths();
        let plan = crate::traffic::Plan {
            rps: crate::demo::DEMO_RPS,
            seconds: crate::traffic::MAX_SECONDS,
            path,
            more_paths,
        };
        r.admin_rt
            .block_on(async { r.traffic.start(plan) })
            .map_err(|_| "traffic generator busy".to_string())?;
        println!("fulcrum demo");
        println!("  dashboard: http://{}/", r.admin);
        println!(
            "  proxy:     http://{}/ (pool web; /api/… goes to pool api)",
            r.listen
        );
        if let (Some(addr), Some(c)) = (r.tls_listen, &certificate) {
            println!(
                "  https:     https://{addr}/ (self-signed; SHA-256 fingerprint {})",
                c.fingerprint
            );
        }
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
