//! The command's manual, made from its one definition (which the command line hands
//! over): the man page (`fulcrum manpage`) and the shell completions (`fulcrum
//! completions SHELL`), and the values a flag's completion offers. See
//! `docs/install.md`.

use std::ffi::OsStr;
use std::io::Write;

use clap::builder::{PossibleValue, TypedValueParser};

use crate::config::options::{FileType, Opt};
use crate::config::strategy_kind::NAMES as STRATEGIES;

/// Prints the completion script of `shell` for `cmd`; the exit status.
pub(crate) fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) -> i32 {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "fulcrum", &mut out);
    0
}

/// Prints the man page of `cmd`; the exit status.
pub(crate) fn manpage(cmd: clap::Command) -> i32 {
    let mut page = Vec::new();
    if let Err(e) = render(cmd, &mut page) {
        eprintln!("error: {e}");
        return 1;
    }
    match std::io::stdout().lock().write_all(&page) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// fulcrum's page, then a section per subcommand with its synopsis and every option
/// (clap_mangen renders one command a page; one page for all reads as nginx's and
/// HAProxy's do).
fn render(mut cmd: clap::Command, w: &mut Vec<u8>) -> std::io::Result<()> {
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone()).section("8");
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    // Listed here, and each described in its own section below.
    writeln!(w, ".SH SUBCOMMANDS")?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        writeln!(
            w,
            ".TP\n\\fBfulcrum {}\\fR\n{}",
            sub.get_name(),
            roff_text(&about)
        )?;
    }
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("fulcrum {}", sub.get_name());
        writeln!(w, ".SH \"{}\"", name.to_uppercase())?;
        if let Some(about) = sub.get_about() {
            writeln!(w, "{}", roff_text(&about.to_string()))?;
        }
        // Built with the root, it is named `fulcrum SUB` in its synopsis.
        // Its synopsis and options as subsections of its section.
        let sub_man = clap_mangen::Man::new(sub.clone());
        let mut part = Vec::new();
        sub_man.render_synopsis_section(&mut part)?;
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            sub_man.render_options_section(&mut part)?;
        }
        let part = String::from_utf8_lossy(&part).replace(".SH ", ".SS ");
        w.extend_from_slice(part.as_bytes());
    }
    man.render_version_section(w)
}

/// Text as a roff line: a leading dot or quote escaped, backslashes doubled.
fn roff_text(text: &str) -> String {
    let t = text.replace('\\', "\\\\");
    match t.chars().next() {
        Some('.' | '\'') => format!("\\&{t}"),
        _ => t,
    }
}

/// A flag's value parser that takes any text (the options table checks it, with its
/// own message) and offers the valid values to completions and `--help`.
#[derive(Clone, Debug)]
pub(crate) struct Offered(Vec<&'static str>);

impl Offered {
    /// The values offered for the option `o`; none for most.
    pub(crate) fn for_option(o: &Opt) -> Offered {
        let values = match o.key {
            "strategy" => STRATEGIES.iter().map(|(_, name, _)| *name).collect(),
            "log_format" => vec!["text", "json"],
            "access_log_format" => vec!["text", "json", "combined"],
            "protocol" => vec!["http1", "h2"],
            // A file, too: completing on/off alone would hide the paths.
            "access_log" => Vec::new(),
            _ if o.file_type == FileType::Switch => vec!["on", "off"],
            _ => Vec::new(),
        };
        Offered(values)
    }
}

impl TypedValueParser for Offered {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        value
            .to_str()
            .map(str::to_string)
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidUtf8).with_cmd(cmd))
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        if self.0.is_empty() {
            return None;
        }
        Some(Box::new(self.0.iter().map(|v| PossibleValue::new(*v))))
    }
}
