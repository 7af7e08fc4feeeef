//! The report page: one self-contained HTML file (no network: every script, style and datum
//! inline), built from the template `assets/report/report.html`, the vendored libraries and
//! the report's JSON.
//!
//! Libraries (vendored minified under `collector/assets/report/`, their licences in
//! `licenses/`, versions in `assets/report/README.md`), chosen because each is the well-kept
//! standard for its job and small enough to inline:
//! * uPlot (MIT): the timeline and the sparklines. A canvas time-series chart of 50 KB that
//!   draws thousands of points without lag, with a hover legend and cursor built in.
//! * d3-flame-graph (Apache-2.0) with the d3 modules it needs (ISC): the flame graphs. The
//!   flame-graph component Brendan Gregg's tools and many profilers' web views use; zoom on
//!   click, search and tooltips built in.

/// The page template: its markers `HEAPDUMP-TITLE`, `/*HEAPDUMP-STYLE*/`, `HEAPDUMP-DATA`,
/// `<!--HEAPDUMP-LIBS-->` and `/*HEAPDUMP-APP*/` are replaced, in this order ([`fill`]).
const TEMPLATE: &str = include_str!("../../assets/report/report.html");
const APP_JS: &str = include_str!("../../assets/report/report.js");
const APP_CSS: &str = include_str!("../../assets/report/report.css");
const UPLOT_CSS: &str = include_str!("../../assets/report/uPlot.min.css");

/// The libraries, in load order (each d3 module extends the global `d3` its dependants use).
const LIBS: [(&str, &str); 15] = [
    (
        "d3-array",
        include_str!("../../assets/report/d3-array.min.js"),
    ),
    (
        "d3-color",
        include_str!("../../assets/report/d3-color.min.js"),
    ),
    (
        "d3-dispatch",
        include_str!("../../assets/report/d3-dispatch.min.js"),
    ),
    (
        "d3-ease",
        include_str!("../../assets/report/d3-ease.min.js"),
    ),
    (
        "d3-format",
        include_str!("../../assets/report/d3-format.min.js"),
    ),
    (
        "d3-interpolate",
        include_str!("../../assets/report/d3-interpolate.min.js"),
    ),
    (
        "d3-time",
        include_str!("../../assets/report/d3-time.min.js"),
    ),
    (
        "d3-time-format",
        include_str!("../../assets/report/d3-time-format.min.js"),
    ),
    (
        "d3-scale",
        include_str!("../../assets/report/d3-scale.min.js"),
    ),
    (
        "d3-selection",
        include_str!("../../assets/report/d3-selection.min.js"),
    ),
    (
        "d3-timer",
        include_str!("../../assets/report/d3-timer.min.js"),
    ),
    (
        "d3-transition",
        include_str!("../../assets/report/d3-transition.min.js"),
    ),
    (
        "d3-hierarchy",
        include_str!("../../assets/report/d3-hierarchy.min.js"),
    ),
    (
        "d3-flame-graph",
        include_str!("../../assets/report/d3-flamegraph.min.js"),
    ),
    ("uPlot", include_str!("../../assets/report/uPlot.min.js")),
];

/// The licences of the libraries, shipped with them (one heading line per library).
const LICENSES: [(&str, &str); 15] = [
    (
        "uPlot 1.6.32",
        include_str!("../../assets/report/licenses/uPlot.LICENSE"),
    ),
    (
        "d3-flame-graph 5.0.0",
        include_str!("../../assets/report/licenses/d3-flame-graph.LICENSE"),
    ),
    (
        "d3-array 3.2.5",
        include_str!("../../assets/report/licenses/d3-array.LICENSE"),
    ),
    (
        "d3-color 3.1.1",
        include_str!("../../assets/report/licenses/d3-color.LICENSE"),
    ),
    (
        "d3-dispatch 3.0.2",
        include_str!("../../assets/report/licenses/d3-dispatch.LICENSE"),
    ),
    (
        "d3-ease 3.0.2",
        include_str!("../../assets/report/licenses/d3-ease.LICENSE"),
    ),
    (
        "d3-format 3.1.3",
        include_str!("../../assets/report/licenses/d3-format.LICENSE"),
    ),
    (
        "d3-hierarchy 3.1.3",
        include_str!("../../assets/report/licenses/d3-hierarchy.LICENSE"),
    ),
    (
        "d3-interpolate 3.0.2",
        include_str!("../../assets/report/licenses/d3-interpolate.LICENSE"),
    ),
    (
        "d3-scale 4.0.3",
        include_str!("../../assets/report/licenses/d3-scale.LICENSE"),
    ),
    (
        "d3-selection 3.0.1",
        include_str!("../../assets/report/licenses/d3-selection.LICENSE"),
    ),
    (
        "d3-time 3.1.1",
        include_str!("../../assets/report/licenses/d3-time.LICENSE"),
    ),
    (
        "d3-time-format 4.1.1",
        include_str!("../../assets/report/licenses/d3-time-format.LICENSE"),
    ),
    (
        "d3-timer 3.0.2",
        include_str!("../../assets/report/licenses/d3-timer.LICENSE"),
    ),
    (
        "d3-transition 3.0.2",
        include_str!("../../assets/report/licenses/d3-transition.LICENSE"),
    ),
];

/// The licence texts as HTML text (escaped).
fn licenses() -> String {
    let mut out = String::new();
    for (name, text) in LICENSES {
        out.push_str(&format!("== {name} ==\n{}\n\n", escape(text)));
    }
    out
}

/// `s` as HTML text: `&`, `<`, `>` escaped.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `data` as text safe inside `<script type="application/json">`: every `<` escaped as
/// `\u003c` (still the same JSON), so that no `</script>` or `<!--` in a function name can end
/// or change the element.
fn json_in_script(data: &serde_json::Value) -> String {
    data.to_string().replace('<', "\\u003c")
}

/// The whole page for `data` (what [`super::model::Report::json`] returns), titled `title`.
pub fn html(title: &str, data: &serde_json::Value) -> String {
    let mut libs = String::new();
    for (name, js) in LIBS {
        // A library's own text never holds `</script` (checked by a test).
        libs.push_str(&format!("<script>/* {name} */\n{js}\n</script>\n"));
    }
    let title = escape(title);
    fill(
        TEMPLATE,
        &[
            ("HEAPDUMP-TITLE", &title),
            ("/*HEAPDUMP-STYLE*/", &format!("{UPLOT_CSS}\n{APP_CSS}")),
            ("HEAPDUMP-TITLE", &title),
            ("HEAPDUMP-LICENSES", &licenses()),
            ("HEAPDUMP-DATA", &json_in_script(data)),
            ("<!--HEAPDUMP-LIBS-->", &libs),
            ("/*HEAPDUMP-APP*/", APP_JS),
        ],
    )
}

/// `template` with each marker replaced by its text, the markers found in the template in
/// this order (never in a text already put in: a function name cannot be taken for a marker).
fn fill(template: &str, parts: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + parts.iter().map(|p| p.1.len()).sum::<usize>());
    let mut rest = template;
    for (marker, text) in parts {
        let (before, after) = rest
            .split_once(marker)
            .unwrap_or_else(|| panic!("the report template lacks {marker} (in order)"));
        out.push_str(before);
        out.push_str(text);
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_can_end_a_script_early() {
        for (name, js) in LIBS.iter().chain([("app", APP_JS)].iter()) {
            assert!(!js.to_ascii_lowercase().contains("</script"), "{name}");
        }
        let data = serde_json::json!({"f": "</script><script>alert(1)</script><!--"});
        let page = html("a < b", &data);
        assert_eq!(page.matches("</script>").count(), LIBS.len() + 2);
        assert!(page.contains("\\u003c/script>\\u003cscript>"));
        assert!(page.contains("<title>heapdump report: a &lt; b</title>"));
        let text = json_in_script(&data);
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, data);
    }
}
