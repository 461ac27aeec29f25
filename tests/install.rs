//! Installing and running fulcrum as a server (`docs/install.md`): its man page and shell
//! completions, read by the real `man` and `bash`.

mod common;

use std::process::{Command, Stdio};

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
