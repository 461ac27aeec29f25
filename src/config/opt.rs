//! What an option of the options table is (`config::options`): how the file writes its
//! value, what a reload does with it, and the row that declares it.

use super::pool_settings::PoolSettings;
use super::Settings;

/// How a value is written in the config file (on the command line every value is text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileType {
    /// A string.
    Str,
    /// An integer.
    Int,
    /// A number, integer or not.
    Float,
    /// A boolean, or the strings `on` and `off`.
    Switch,
    /// A string, or a list of strings (joined with commas).
    StrOrList,
    /// A size: an integer (bytes) or a string with a unit (`"1m"`).
    Size,
    /// A table of plain values (`{ interval = "10s", min_hosts = 3 }`), or on the
    /// command line the same as `key=value` pairs joined with commas.
    Pairs,
    /// An integer, or a string (`max_conns = 8` or `max_conns = "auto"`).
    IntOrStr,
}

/// What a reload does with a changed value, and whether a pool may set it for itself.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reload {
    /// Applied to the running process (see `reload.rs`).
    Live,
    /// Kept until a restart; a change is listed in `restart_required` under this name.
    Restart(&'static str, fn(&Settings, &Settings) -> bool),
    /// A pool's own setting ([`PoolSettings`]), applied to the running pool.
    PoolLive,
    /// A pool's own setting, kept while the pool runs; a change is listed in
    /// `restart_required` under this name (`pools.NAME.` before it for a `[[pools]]`
    /// entry's own value).
    PoolRestart(&'static str, fn(&PoolSettings, &PoolSettings) -> bool),
}

/// One option.
#[derive(Debug)]
pub(crate) struct Opt {
    /// The config file's key; the flag is `--` + the key with `-` for `_`.
    pub(crate) key: &'static str,
    /// The table (`health`, `outlier`, `sticky`) and the key inside it under which the file may
    /// also write this setting, if it has one.
    pub(crate) table_key: Option<(&'static str, &'static str)>,
    /// The placeholder of the flag's value in `--help`.
    pub(crate) value_name: &'static str,
    /// What it does, for `--help`.
    pub(crate) help: &'static str,
    /// The built-in default as it would be written; `None` when there is none or it is
    /// not a constant (see `default_text`).
    pub(crate) default: Option<&'static str>,
    /// The default as `--help` states it when it is not a constant.
    pub(crate) default_text: Option<&'static str>,
    /// How the file writes it.
    pub(crate) file_type: FileType,
    /// Parses a value and stores it.
    pub(crate) set: fn(&mut Settings, &str) -> Result<(), String>,
    /// What a reload does with it.
    pub(crate) reload: Reload,
}

impl Opt {
    /// Whether a pool may set it for itself (a key of `[[pools]]` and of a pool made
    /// through the admin API or the store).
    pub(crate) fn per_pool(&self) -> bool {
        matches!(self.reload, Reload::PoolLive | Reload::PoolRestart(..))
    }

    /// The flag's name, without the leading `--`.
    pub(crate) fn flag(&self) -> String {
        self.key.replace('_', "-")
    }

    /// The help line with the default, as `--help` prints it.
    pub(crate) fn help_line(&self) -> String {
        match self.default.or(self.default_text) {
            Some(d) => format!("{} [default: {d}]", self.help),
            None => self.help.to_string(),
        }
    }
}
