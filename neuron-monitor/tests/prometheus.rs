//! `neuron-monitor --prometheus-listen` end to end: a real Prometheus server (Debian's
//! `prometheus` package, with exemplar storage on) scrapes the exporter while a tagged
//! workload of known size runs, and its HTTP API must give back what the workload did,
//! and exemplars that lead to its slow and its failed executions. The exposition passes
//! `promtool check metrics`, and the Grafana dashboard queries only exported metrics.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::http::{http_get, http_get_accepting};
use neuron_test_support::process::{Running, Sandbox};
use regex::Regex;
use serde_json::Value;

const MONITOR: &str = env!("CARGO_BIN_EXE_neuron-monitor");
const TAG: &str = "prom-e2e";

/// A tool CI installs; outside CI a missing tool skips that part with a note.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        neuron_test_support::ci::missing(
            &format!("{name} is not installed (apt-get install prometheus)"),
            "the part that needs it",
        );
    }
    found
}

/// Percent-encodes a query-string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant PromQL query: each result's labels and value.
fn query(prometheus: SocketAddr, promql: &str) -> Vec<(Value, f64)> {
    let (status, body) = http_get(prometheus, &format!("/api/v1/query?query={}", encode(promql)));
    assert_eq!(status, 200, "{promql}: {body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    answer["data"]["result"]
        .as_array()
        .expect("a vector")
        .iter()
        .map(|r| (r["metric"].clone(), r["value"][1].as_str().and_then(|v| v.parse().ok()).expect("a value")))
        .collect()
}

/// The names of the samples in an exposition.
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The metric names a PromQL expression selects: what is left once label matchers,
/// ranges, strings, grouping clauses and function calls are taken out.
fn queried_metrics(expr: &str) -> BTreeSet<String> {
    let mut rest = expr.to_string();
    for pattern in
        [r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\{[^}]*\}", r"\[[^\]]*\]", r#""[^"]*""#]
    {
        rest = Regex::new(pattern).expect("regex").replace_all(&rest, " ").into_owned();
    }
    let keywords = ["and", "or", "unless", "bool", "offset"];
    Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?")
        .expect("regex")
        .captures_iter(&rest)
        .filter(|c| c.get(1).is_none())
        .map(|c| c[0].to_string())
        .filter(|name| !keywords.contains(&name.as_str()))
        .collect()
}

#[test]
fn queried_metrics_finds_the_selected_names_only() {
    let expr = r#"histogram_quantile(0.99, sum by (runtime_tag, le) (rate(neuron_execution_latency_seconds_bucket{runtime_tag=~"$runtime_tag"}[$__rate_interval]))) > 0 or on (x) up"#;
    assert_eq!(queried_metrics(expr), BTreeSet::from(["neuron_execution_latency_seconds_bucket".into(), "up".into()]));
}

#[test]
fn prometheus_scrapes_the_exporter_while_a_workload_runs() {
    // Built before anything is timed.
    let bench_exe = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    let config = sandbox.every_group_config("500ms");

    // The exporter, on a free loopback port it prints.
    let mut monitor = Running(
        sandbox
            .env(&mut Command::new(MONITOR))
            .arg("-c")
            .arg(&config)
            .args(["--prometheus-listen", "0", "--no-stdout"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("monitor"),
    );
    let mut stderr = BufReader::new(monitor.0.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("the address line");
    let exporter: SocketAddr = Regex::new(r"http://([0-9.:]+)/metrics")
        .expect("regex")
        .captures(&line)
        .and_then(|c| c[1].parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    assert!(exporter.ip().is_loopback(), "a port alone listens on loopback: {exporter}");

    // A real Prometheus server scraping it every 200 ms: each report (every 500 ms) is
    // scraped at least twice.
    let prometheus_bin = tool("prometheus");
    let prometheus_addr = SocketAddr::from(([127, 0, 0, 1], neuron_test_support::process::free_port()));
    let _prometheus = prometheus_bin.as_ref().map(|bin| {
        let yml = dir.join("prometheus.yml");
        std::fs::write(
            &yml,
            format!(
                "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\nscrape_configs:\n  - job_name: neuron\n    static_configs:\n      - targets: ['{exporter}']\n"
            ),
        )
        .expect("prometheus.yml");
        Running(
            Command::new(bin)
                .arg(format!("--config.file={}", yml.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
                .arg(format!("--web.listen-address={prometheus_addr}"))
                .arg("--enable-feature=exemplar-storage")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prometheus"),
        )
    });

    // Ready, and scraping the exporter, before the workload starts.
    if prometheus_bin.is_some() {
        let started = Instant::now();
        loop {
            let up = TcpStream::connect(prometheus_addr).is_ok()
                && http_get(prometheus_addr, "/-/ready").0 == 200
                && query(prometheus_addr, "up{job=\"neuron\"}").iter().any(|(_, v)| *v == 1.0);
            if up {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "Prometheus never scraped the exporter");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // A tagged workload of a known size on two cores: 60 executions each, every third
    // on core 0 failing with an out-of-bounds access (20 of them), the 40th on core 1
    // slow (300 ms late).
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let bench_log = dir.join("bench.log");
    let mut bench = Running(
        sandbox
            .env(&mut Command::new(&bench_exe))
            .env("NEURON_PROCESS_TAG", TAG)
            .env("NEURON_RT_FAULT_INJECT", "oob:core=0:every=3,slow:core=1:every=40:delay=300ms")
            .env("NEURON_RT_LOG_LEVEL", "WARN")
            .args(["exec", mlp.to_str().expect("utf-8"), "--cores", "0-1", "--iterations", "60"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&bench_log).expect("the bench's log"))
            .spawn()
            .expect("bench"),
    );
    let bench_pid = bench.0.id();

    // While it runs: the exposition has the workload's series, passes promtool, and
    // holds every metric the Grafana dashboard queries.
    let started = Instant::now();
    let exposition = loop {
        let (status, body) = http_get(exporter, "/metrics");
        if status == 200 && body.contains("neuroncore_utilization_ratio{") && body.contains(TAG) {
            let busy = body
                .lines()
                .any(|l| l.starts_with("neuroncore_utilization_ratio{") && l.contains(TAG) && !l.ends_with(" 0"));
            if busy && body.contains("execution_latency_seconds{") {
                break body;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the workload never showed up busy:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some(promtool) = tool("promtool") {
        check_with_promtool(&promtool, &exposition);
    }
    check_dashboard(&exposition);
    assert!(!exposition.contains(" # {") && !exposition.contains("# EOF"), "no exemplars in the text format");
    // A scraper that asks for OpenMetrics gets it, with the executions behind the
    // latency buckets.
    let (status, content_type, openmetrics) =
        http_get_accepting(exporter, "/metrics", Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"));
    assert_eq!(status, 200);
    assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"), "{content_type}");
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    let pid_label = format!("pid=\"{bench_pid}\"");
    assert!(
        openmetrics.lines().any(|l| l.starts_with("neuron_execution_latency_seconds_bucket{")
            && l.contains(TAG)
            && l.contains(" # {exec_id=\"")
            && l.contains(&pid_label)),
        "{openmetrics}"
    );

    assert_eq!(bench.0.wait().expect("bench ends").code(), Some(1), "the injected faults fail executions");
    // The executions the faults struck, from the runtime's log lines.
    let log = std::fs::read_to_string(&bench_log).expect("the bench's log");
    let struck = |what: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(what))
            .filter_map(|l| l.split("in execution id ").nth(1)?.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let slow = struck("stalled before the execution");
    assert_eq!(slow.len(), 1, "one slow execution: {log}");
    let failed = struck("out-of-bound access");
    assert_eq!(failed.len(), 20, "{log}");

    // Once it has exited, its series disappear from the exposition.
    let started = Instant::now();
    loop {
        let (status, body) = http_get(exporter, "/metrics");
        assert_eq!(status, 200);
        if !body.contains(TAG) {
            assert!(body.contains("system_memory_total_bytes"), "{body}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the exited runtime's series stay:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let Some(_) = prometheus_bin else { return };
    // What Prometheus stored. The last scrape before the runtime exited holds its final
    // counts; the series are stale since, so look back over a range.
    let counts = |promql: &str| -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = query(prometheus_addr, promql)
            .into_iter()
            .map(|(labels, v)| {
                let key = ["status_type", "error_type", "neuroncore"]
                    .iter()
                    .find_map(|k| labels[k].as_str())
                    .unwrap_or("")
                    .to_string();
                (key, v)
            })
            .filter(|(_, v)| *v > 0.0)
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    let started = Instant::now();
    let status = loop {
        let status = counts(&format!("max_over_time(execution_status_total{{runtime_tag=\"{TAG}\"}}[5m])"));
        let total: f64 = status.iter().map(|(_, v)| v).sum();
        if total >= 120.0 {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "Prometheus has {status:?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(status, [("completed".to_string(), 100.0), ("completed_with_err".to_string(), 20.0)]);
    let errors = counts(&format!("max_over_time(execution_errors_total{{runtime_tag=\"{TAG}\"}}[5m])"));
    assert_eq!(errors, [("model".to_string(), 20.0)]);
    let utilisation = counts(&format!("max_over_time(neuroncore_utilization_ratio{{runtime_tag=\"{TAG}\"}}[5m])"));
    assert_eq!(utilisation.iter().map(|(core, _)| core.as_str()).collect::<Vec<_>>(), ["0", "1"], "{utilisation:?}");
    assert!(utilisation.iter().all(|(_, v)| *v > 0.0 && *v <= 1.0), "{utilisation:?}");
    let histogram =
        counts(&format!("max_over_time(neuron_execution_latency_seconds_count{{runtime_tag=\"{TAG}\"}}[5m])"));
    assert_eq!(histogram, [("0".to_string(), 60.0), ("1".to_string(), 60.0)], "every execution has a latency");
    // Per model, labelled by its name: the MLP loaded on each core.
    let per_model = query(
        prometheus_addr,
        &format!("max_over_time(neuron_model_execution_latency_seconds_count{{runtime_tag=\"{TAG}\"}}[5m])"),
    );
    let mut models: Vec<(String, String, f64)> = per_model
        .iter()
        .map(|(labels, v)| {
            let label = |k: &str| labels[k].as_str().unwrap_or("").to_string();
            (label("model"), label("neuroncore"), *v)
        })
        .collect();
    models.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        models,
        [("mlp".to_string(), "0".to_string(), 60.0), ("mlp".to_string(), "1".to_string(), 60.0)],
        "each model's executions, under its name"
    );
    // Exemplars: the slow execution, behind the latency bucket it counted in; a failed
    // one behind the error count.
    let exemplars = |promql: &str| -> Vec<(Value, f64)> {
        let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs_f64();
        let path = format!("/api/v1/query_exemplars?query={}&start={}&end={}", encode(promql), end - 600.0, end + 60.0);
        let (status, body) = http_get(prometheus_addr, &path);
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        (answer["data"].as_array().into_iter().flatten())
            .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
            .map(|e| (e["labels"].clone(), e["value"].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)))
            .collect()
    };
    let started = Instant::now();
    let slowest = loop {
        let found = exemplars(&format!("neuron_execution_latency_seconds_bucket{{runtime_tag=\"{TAG}\"}}"));
        if let Some(e) = found.iter().find(|(labels, _)| labels["exec_id"] == slow[0].as_str()) {
            break e.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no exemplar of execution {}: {found:?}", slow[0]);
        std::thread::sleep(Duration::from_millis(250));
    };
    let (labels, seconds) = slowest;
    assert_eq!(labels["neuroncore"], "1", "{labels}");
    assert_eq!(labels["model"], "mlp", "{labels}");
    assert_eq!(labels["pid"], bench_pid.to_string().as_str(), "{labels}");
    assert_eq!(labels["execution"], format!("{bench_pid}:{}", slow[0]).as_str(), "the link's label: {labels}");
    assert!((0.3..30.0).contains(&seconds), "its latency: {seconds} s");
    let errors = exemplars(&format!("execution_errors_total{{runtime_tag=\"{TAG}\",error_type=\"model\"}}"));
    assert!(!errors.is_empty(), "an exemplar of the model errors");
    for (labels, value) in &errors {
        let id = labels["exec_id"].as_str().unwrap_or("");
        assert!(failed.iter().any(|f| f == id), "{labels} names a failed execution: {failed:?}");
        assert_eq!(labels["neuroncore"], "0", "{labels}");
        assert_eq!(*value, 1.0);
    }

    // Now: no live series of the exited runtime.
    let started = Instant::now();
    while !query(prometheus_addr, &format!("execution_status_total{{runtime_tag=\"{TAG}\"}}")).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "the exited runtime's series stay live in Prometheus");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!query(prometheus_addr, "system_memory_total_bytes").is_empty());
}

/// `promtool check metrics`: no parse error, and no lint finding but the one on
/// `system_vcpu_count`, a name the ecosystem's dashboards need that promtool's
/// naming rules (a `_count` suffix outside histograms) dislike.
fn check_with_promtool(promtool: &Path, exposition: &str) {
    let run = |text: &str| {
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool");
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
        let out = child.wait_with_output().expect("promtool ends");
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (code, findings) = run(exposition);
    let findings: Vec<&str> = findings.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        findings.iter().all(|f| f.starts_with("system_vcpu_count ")),
        "promtool check metrics (exit {code:?}): {findings:?}"
    );
    let without: String =
        exposition.lines().filter(|l| !l.contains("system_vcpu_count")).map(|l| format!("{l}\n")).collect();
    let (code, findings) = run(&without);
    assert_eq!(code, Some(0), "promtool check metrics: {findings}");
}

/// Every metric the Grafana dashboard (and its variables) queries is in `exposition`.
fn check_dashboard(exposition: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../grafana/neuron-monitor.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    let exported = sample_names(exposition);
    let mut ids = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "panel ids are unique: {panel}");
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            queried.extend(queried_metrics(target["expr"].as_str().expect("expr")));
        }
    }
    let label_values = Regex::new(r"label_values\((\w+)").expect("regex");
    for variable in dashboard["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = variable["definition"].as_str() {
            let metric = label_values.captures(q).map(|c| c[1].to_string());
            queried.extend(metric);
        }
    }
    assert!(queried.len() >= 15, "{queried:?}");
    // The ranks' series need a job of ranks: `ranks.rs` checks those.
    queried.retain(|m| !m.starts_with("neuron_collective_"));
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics that are not exported: {missing:?}");

    // The latency panel asks for the histogram's exemplars, and the provisioned data
    // source links their `exec_id` to the dashboard's route for an execution.
    let latency = (dashboard["panels"].as_array().into_iter().flatten())
        .find(|p| p["title"] == "Execution latency")
        .expect("the latency panel");
    let exemplars: Vec<&Value> =
        (latency["targets"].as_array().into_iter().flatten()).filter(|t| t["exemplar"] == true).collect();
    assert!(
        exemplars.len() == 1
            && exemplars[0]["expr"].as_str().is_some_and(|e| e.contains("neuron_execution_latency_seconds_bucket")),
        "{latency}"
    );
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../grafana/provisioning/datasources/neuron-monitor.yaml");
    let source = std::fs::read_to_string(source).expect("the data source's provisioning");
    assert!(source.contains("exemplarTraceIdDestinations:\n        - name: execution\n"), "{source}");
    let link = Regex::new(r"url: (http://[^\s]+/#/execution/)\$\$\{__value\.raw\}\n").expect("regex");
    assert!(link.is_match(&source), "the link names the execution by its id: {source}");
    let router = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web/assets/app.js");
    let router = std::fs::read_to_string(router).expect("the dashboard's router");
    assert!(router.contains("page === 'execution' && parts[1]"), "the dashboard has that route");
}
