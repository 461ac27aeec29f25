//! Installing and running fulcrum as a server (`docs/install.md`): its man page and shell
//! completions, read by the real `man` and `bash`.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// `fulcrum ARGS`' standard output, which must succeed.
fn stdout_of(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "fulcrum {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags `fulcrum SUB --help` lists.
fn flags_of(sub: &str) -> Vec<String> {
    stdout_of(&[sub, "--help"])
        .lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| {
            l.trim_start()
                .split([' ', ',', '='])
                .find(|w| w.starts_with("--"))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_man_page_renders_every_subcommand_and_option() {
    let page = stdout_of(&["manpage"]);
    let mut man = Command::new("man")
        .args(["-l", "-P", "cat", "-"])
        .env("MANWIDTH", "200")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("man runs (apt-get install man-db)");
    let mut stdin = man.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, page.as_bytes()).unwrap();
    drop(stdin);
    let out = man.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "man warns: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for sub in [
        "serve",
        "demo",
        "backend",
        "check",
        "lab",
        "completions",
        "manpage",
    ] {
        assert!(
            text.contains(&format!("FULCRUM {}", sub.to_uppercase())),
            "no section for {sub}"
        );
        for flag in flags_of(sub) {
            assert!(
                // An option's entry: `--flag <VALUE>`, or `-f, --flag`.
                text.lines()
                    .any(|l| l.trim_start().split(", ").any(|p| p.starts_with(&flag))),
                "{sub}: {flag} not described"
            );
        }
    }
    assert!(flags_of("serve").len() > 50, "serve has all its options");
}

/// What bash's completion offers for the words typed so far (the last one being
/// completed), as `complete -F` would call the function `fulcrum completions bash` defines.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = stdout_of(&["completions", "bash"]);
    let dir = std::env::temp_dir().join(format!("fulcrum-completion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fulcrum.bash");
    std::fs::write(&file, script).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let line = words.join(" ");
    let probe = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE='{line}'\nCOMP_POINT={}\n\
         _fulcrum fulcrum '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        file.display(),
        quoted.join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = Command::new("bash").arg("-c").arg(probe).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_subcommands_flags_and_strategy_names() {
    assert_eq!(bash_completes(&["fulcrum", "se"]), vec!["serve"]);
    let flags = bash_completes(&["fulcrum", "serve", "--stra"]);
    assert_eq!(flags, vec!["--strategy"]);
    let names = bash_completes(&["fulcrum", "serve", "--strategy", ""]);
    for s in ["round_robin", "least_connections", "peak_ewma", "maglev"] {
        assert!(names.iter().any(|n| n == s), "{s} not offered: {names:?}");
    }
    let names = bash_completes(&["fulcrum", "serve", "--strategy", "least_"]);
    assert_eq!(names, vec!["least_connections", "least_response_time"]);
}

#[test]
fn a_strategy_alias_is_still_taken_and_a_bad_one_refused_by_the_table() {
    let cfg = config_file("install", "alias", "strategy = \"rr\"\n");
    let (status, _, err) = run_fulcrum(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(status.code(), Some(0), "{err}");
    let (status, _, err) = run_fulcrum(&[
        "serve",
        "--strategy",
        "fastest",
        "--backend",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("fastest") && err.contains("round_robin"),
        "{err}"
    );
}

/// A stand-in for systemd's notification socket: a Unix datagram socket the test reads.
struct Manager {
    sock: std::os::unix::net::UnixDatagram,
    path: std::path::PathBuf,
}

impl Manager {
    fn new(tag: &str) -> Manager {
        let dir = std::env::temp_dir().join(format!("fulcrum-notify-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        Manager { sock, path }
    }

    /// The next message but the watchdog's keep-alives (counted in `keepalives`), or
    /// `None` after `limit`.
    fn next(&self, limit: Duration, keepalives: &mut u32) -> Option<String> {
        let start = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        while start.elapsed() < limit {
            self.sock
                .set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let Ok(n) = self.sock.recv(&mut buf) else {
                continue;
            };
            let text = String::from_utf8_lossy(&buf[..n]).trim().to_string();
            if text == "WATCHDOG=1" {
                *keepalives += 1;
                continue;
            }
            return Some(text);
        }
        None
    }
}

#[test]
fn systemd_hears_ready_once_serving_then_each_reload_and_the_stop() {
    let backend = TestBackend::start("A");
    let manager = Manager::new("cycle");
    let cfg = config_file(
        "install",
        "notify",
        &format!("[[backends]]\nurl = \"{}\"\n", backend.url()),
    );
    let env = [
        ("NOTIFY_SOCKET", manager.path.to_str().unwrap()),
        ("WATCHDOG_USEC", "600000"),
    ];
    let mut f = Fulcrum::start_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &["--config", cfg.to_str().unwrap(), "--workers", "2"],
        &env,
    );
    let mut keepalives = 0;
    let first = manager.next(Duration::from_secs(5), &mut keepalives);
    assert_eq!(first.as_deref(), Some("READY=1"), "{}", f.log());
    // Ready means serving: a request is answered at once.
    assert_eq!(
        raw_exchange(
            f.proxy,
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            Duration::from_secs(5)
        )
        .lines()
        .next(),
        Some("HTTP/1.1 200 OK")
    );
    f.signal("HUP");
    let reloading = manager
        .next(Duration::from_secs(5), &mut keepalives)
        .unwrap_or_default();
    let mut lines = reloading.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{reloading}");
    let usec: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .expect("MONOTONIC_USEC");
    assert!(usec > 0);
    assert_eq!(
        manager
            .next(Duration::from_secs(5), &mut keepalives)
            .as_deref(),
        Some("READY=1")
    );
    // The watchdog's keep-alive every half of WATCHDOG_USEC while the workers beat.
    let mut idle = 0;
    assert_eq!(manager.next(Duration::from_millis(1500), &mut idle), None);
    assert!(
        idle >= 2,
        "{idle} keep-alives in 1.5 s with a 600 ms watchdog"
    );
    f.signal("TERM");
    assert_eq!(
        manager
            .next(Duration::from_secs(5), &mut keepalives)
            .as_deref(),
        Some("STOPPING=1")
    );
    assert!(f.wait_exit(Duration::from_secs(15)).is_some());
}

#[test]
fn after_an_upgrade_the_new_process_is_the_main_one() {
    let backend = TestBackend::start("A");
    let manager = Manager::new("upgrade");
    let sock = manager.path.with_file_name("upgrade.sock");
    let args = [
        "--backend",
        &backend.spec(),
        "--upgrade-socket",
        sock.to_str().unwrap(),
    ];
    let env = [("NOTIFY_SOCKET", manager.path.to_str().unwrap())];
    let base = ["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    let mut old = Fulcrum::start_env(&base, &args, &env);
    let mut none = 0;
    assert_eq!(
        manager.next(Duration::from_secs(5), &mut none).as_deref(),
        Some("READY=1")
    );
    let port = old.proxy.port().to_string();
    let admin = old.admin.port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let admin_at = format!("127.0.0.1:{admin}");
    let new_base = ["serve", "--listen", &listen, "--admin", &admin_at];
    let mut upgraded_args = args.to_vec();
    upgraded_args.push("--upgrade");
    let new = Fulcrum::start_env(&new_base, &upgraded_args, &env);
    let said = manager
        .next(Duration::from_secs(10), &mut none)
        .unwrap_or_default();
    assert_eq!(said, format!("MAINPID={}\nREADY=1", new.child.id()));
    // The old process drains and goes without saying the service stops.
    assert!(old.wait_exit(Duration::from_secs(15)).is_some());
    assert_eq!(manager.next(Duration::from_millis(500), &mut none), None);
    new.signal("TERM");
    assert_eq!(
        manager.next(Duration::from_secs(5), &mut none).as_deref(),
        Some("STOPPING=1")
    );
}

/// The lines of the files at `paths` (missing ones count for none).
fn lines_of(paths: &[&std::path::Path]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| {
            assert!(t.is_empty() || t.ends_with('\n'), "a line cut at the end");
            t.lines().map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

/// Whether `line` is a whole combined-format line for a request of the load.
fn is_combined(line: &str) -> bool {
    let Some((client, rest)) = line.split_once(" - - [") else {
        return false;
    };
    let Some((time, rest)) = rest.split_once("] \"") else {
        return false;
    };
    client == "127.0.0.1"
        && time.ends_with(" +0000")
        && (rest.starts_with("GET /") || rest.starts_with("POST /"))
        && rest.contains(" HTTP/1.1\" 200 ")
        && rest.ends_with('"')
}

#[test]
fn a_rotation_under_load_loses_and_splits_no_access_log_line() {
    let backend = TestBackend::start("A");
    let dir = std::env::temp_dir().join(format!("fulcrum-accesslog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let rotated = dir.join("access.log.1");
    let mut f = Fulcrum::over(
        &[&backend],
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "combined",
            "--workers",
            "2",
        ],
    );
    let load = Load::start(f.proxy, 4, 5);
    std::thread::sleep(Duration::from_millis(700));
    // What logrotate does: move the file, then tell the process.
    std::fs::rename(&log, &rotated).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    f.signal("USR1");
    std::thread::sleep(Duration::from_millis(700));
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?}");
    f.signal("TERM");
    assert!(f.wait_exit(Duration::from_secs(15)).is_some());
    let before = lines_of(&[&rotated]);
    let after = lines_of(&[&log]);
    assert!(
        !before.is_empty() && !after.is_empty(),
        "{} then {}",
        before.len(),
        after.len()
    );
    let all: Vec<&String> = before.iter().chain(&after).collect();
    assert_eq!(all.len() as u64, ok, "every request has its one line");
    for line in all {
        assert!(is_combined(line), "not a whole combined line: {line:?}");
    }
    assert!(
        f.log().contains("SIGUSR1: access log reopened"),
        "{}",
        f.log()
    );
}

#[test]
fn an_unwritable_access_log_is_refused_and_a_failed_reopen_keeps_the_old_file() {
    for (path, why) in [
        ("/no/such/dir/access.log", "no directory"),
        ("/proc/fulcrum-access.log", "cannot write"),
    ] {
        let (status, _, err) = run_fulcrum(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--backend",
            "http://127.0.0.1:1",
            "--access-log",
            path,
        ]);
        assert_eq!(status.code(), Some(2), "{path}: {err}");
        assert!(err.contains(path) && err.contains(why), "{path}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // The directory goes away: the reopen fails, and lines go on to the old file.
    let backend = TestBackend::start("A");
    let root = std::env::temp_dir().join(format!("fulcrum-reopen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let mut f = Fulcrum::over(
        &[&backend],
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "json",
        ],
    );
    let get = |f: &Fulcrum| {
        raw_exchange(
            f.proxy,
            b"GET /one HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
    };
    assert!(get(&f).starts_with("HTTP/1.1 200"));
    let moved = root.join("elsewhere");
    std::fs::rename(&dir, &moved).unwrap();
    f.signal("USR1");
    assert!(
        f.log_line(&["SIGUSR1", "cannot reopen"], Duration::from_secs(5))
            .is_some(),
        "{}",
        f.log()
    );
    assert!(get(&f).starts_with("HTTP/1.1 200"));
    f.signal("TERM");
    assert!(f.wait_exit(Duration::from_secs(15)).is_some());
    let lines = lines_of(&[&moved.join("access.log")]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["fields"]["path"], "/one", "{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_is_forwarded_and_made_when_absent_with_trace_context() {
    let backend = TestBackend::start("A");
    let c = client();
    let theirs = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let seen = |b: &TestBackend| {
        let h = b.stats.last_headers.lock().unwrap().clone().unwrap();
        h.get("traceparent")
            .map(|v| v.to_str().unwrap().to_string())
    };
    // Off (the default): forwarded as it came, never made.
    let f = Fulcrum::over(&[&backend], &[]);
    send(&c, "GET", &f.url("/a"), &[("traceparent", theirs)], "").await;
    assert_eq!(seen(&backend).as_deref(), Some(theirs));
    get(&c, &f.url("/b")).await;
    assert_eq!(seen(&backend), None);
    drop(f);
    // On: a request without one gets one, its trace id the request id.
    let f = Fulcrum::over(&[&backend], &["--trace-context", "on"]);
    let r = get(&c, &f.url("/c")).await;
    let made = seen(&backend).expect("a traceparent");
    let parts: Vec<&str> = made.split('-').collect();
    assert_eq!(parts.len(), 4, "{made}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{made}");
    assert_eq!(Some(parts[1]), r.header("x-request-id"), "{made}");
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    assert!(
        hex(parts[2], 16) && parts[2] != "0000000000000000",
        "{made}"
    );
    // A client's own stays as it is.
    send(&c, "GET", &f.url("/d"), &[("traceparent", theirs)], "").await;
    assert_eq!(seen(&backend).as_deref(), Some(theirs));
    // A POST (through hyper's server) gets one too.
    send(&c, "POST", &f.url("/e"), &[], "body").await;
    assert!(seen(&backend).is_some_and(|t| t.starts_with("00-") && t != theirs));
}

#[test]
fn the_packaged_man_page_and_completions_are_current() {
    let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/assets");
    for (args, file) in [
        (&["manpage"][..], "fulcrum.8"),
        (&["completions", "bash"][..], "fulcrum.bash"),
        (&["completions", "zsh"][..], "_fulcrum"),
        (&["completions", "fish"][..], "fulcrum.fish"),
    ] {
        let now = stdout_of(args);
        let kept = std::fs::read_to_string(assets.join(file)).unwrap_or_default();
        assert!(
            now == kept,
            "packaging/assets/{file} is out of date: fulcrum {} > packaging/assets/{file}",
            args.join(" ")
        );
    }
}
