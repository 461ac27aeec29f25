//! `[tracing]` (`docs/tracing.md`): where spans go (an OTLP/HTTP collector), which share
//! of requests starts a trace, the service's name, how many spans may wait, and the
//! fields every export carries (a collector's token). Read from the file only.

use toml::de::DeValue;
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;

const KEYS: &str = "otlp, sample, service_name, max_queue, headers";

/// The `[tracing]` table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceSettings {
    /// Where spans are posted: `otlp` with `/v1/traces` when it has no path.
    pub(crate) endpoint: http::Uri,
    /// The share of requests without a `traceparent` that start a trace, 0 to 1.
    pub(crate) sample: f64,
    /// `service.name` of the spans' resource.
    pub(crate) service_name: String,
    /// Spans that may wait for the collector; more are dropped and counted.
    pub(crate) max_queue: usize,
    /// Fields sent with every export.
    pub(crate) headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// The spans that may wait by default.
const DEFAULT_MAX_QUEUE: usize = 2048;

/// Reads `[tracing]`; `None` (with the errors pushed) when it is unusable.
pub(super) fn read_table(
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
) -> Option<TraceSettings> {
    let at = value.span().start;
    let Some(table) = value.get_ref().as_table() else {
        c.push(at, Some("tracing"), "expected a table".into());
        return None;
    };
    let mut s = TraceSettings {
        endpoint: http::Uri::from_static("http://127.0.0.1:4318/v1/traces"),
        sample: 1.0,
        service_name: "fulcrum".into(),
        max_queue: DEFAULT_MAX_QUEUE,
        headers: Vec::new(),
    };
    let (mut ok, mut endpoint) = (true, false);
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let shown = format!("tracing.{k}");
        let read = match k {
            "headers" => read_headers(v).map(|h| s.headers = h),
            "otlp" => c.text_of(v, FileType::Str, &shown).map_or(Err(None), |t| {
                endpoint = true;
                parse_endpoint(&t).map(|u| s.endpoint = u).map_err(Some)
            }),
            "sample" => c
                .text_of(v, FileType::Float, &shown)
                .map_or(Err(None), |t| {
                    parse_sample(&t).map(|x| s.sample = x).map_err(Some)
                }),
            "service_name" => c.text_of(v, FileType::Str, &shown).map_or(Err(None), |t| {
                (!t.trim().is_empty())
                    .then(|| s.service_name = t)
                    .ok_or(Some("expected a name".into()))
            }),
            "max_queue" => c.text_of(v, FileType::Int, &shown).map_or(Err(None), |t| {
                match t.parse::<usize>() {
                    Ok(n) if (1..=1 << 20).contains(&n) => {
                        s.max_queue = n;
                        Ok(())
                    }
                    _ => Err(Some(format!("'{t}' is not a queue length (1 to 1048576)"))),
                }
            }),
            _ => {
                let msg = format!("unknown key '{shown}' (valid: {KEYS})");
                c.push(key.span().start, None, msg);
                ok = false;
                continue;
            }
        };
        if let Err(why) = read {
            ok = false;
            if let Some(why) = why {
                c.push(v.span().start, Some(&shown), why);
            }
        }
    }
    if !endpoint && ok {
        c.push(
            at,
            Some("tracing"),
            "missing field 'otlp' (the collector's URL)".into(),
        );
        ok = false;
    }
    ok.then_some(s)
}

/// An `http://` or `https://` URL with a host; `/v1/traces` when it has no path.
fn parse_endpoint(text: &str) -> Result<http::Uri, String> {
    let bad = || format!("'{text}' is not an http:// or https:// URL of a collector");
    let uri: http::Uri = text.parse().map_err(|_| bad())?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) {
        return Err(bad());
    }
    let has_path = uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty());
    if has_path {
        return Ok(uri);
    }
    let base = text.trim_end_matches('/');
    format!("{base}/v1/traces").parse().map_err(|_| bad())
}

/// A share from 0 to 1.
fn parse_sample(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("'{text}' is not a share from 0 to 1")),
    }
}

/// `headers = { name = "value", … }`; `Err(Some(why))` names the bad one.
fn read_headers(
    v: &Spanned<DeValue<'_>>,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, Option<String>> {
    let Some(table) = v.get_ref().as_table() else {
        return Err(Some(
            "expected a table such as { authorization = \"Bearer …\" }".into(),
        ));
    };
    let mut out = Vec::new();
    for (name, value) in table {
        let name = name.get_ref().as_ref();
        let bad = || Some(format!("'{name}' is not a field name with a string value"));
        let value = value.get_ref().as_str().ok_or_else(bad)?;
        let n = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
        let v = http::HeaderValue::from_str(value).map_err(|_| bad())?;
        out.push((n, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_gets_the_traces_path_unless_it_has_one() {
        let e = |t| parse_endpoint(t).map(|u| u.to_string());
        assert_eq!(
            e("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            e("https://c.example/").unwrap(),
            "https://c.example/v1/traces"
        );
        assert_eq!(
            e("http://c:4318/otlp/traces").unwrap(),
            "http://c:4318/otlp/traces"
        );
        assert!(e("grpc://127.0.0.1:4317").is_err());
        assert!(e("127.0.0.1:4318").is_err());
        assert!(e("http://").is_err());
    }

    #[test]
    fn the_sample_is_a_share() {
        assert_eq!(parse_sample("0.25"), Ok(0.25));
        assert_eq!(parse_sample("1"), Ok(1.0));
        assert!(parse_sample("1.5").is_err());
        assert!(parse_sample("-0.1").is_err());
        assert!(parse_sample("NaN").is_err());
    }
}
