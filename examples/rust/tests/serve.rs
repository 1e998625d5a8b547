//! Drives the service binary: good and bad requests on its stdin, one response per request on its stdout,
//! perplexities equal to the library's own for the same tokens. Bounded: the child is killed after a minute.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use tinyloop::{Model, ScoreOptions};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tiny.tinyloop")
}

/// Runs the service on `requests` (one line each) and returns its responses keyed by their "id" (or, for
/// responses with a null id, under "null").
fn serve(requests: &[String]) -> HashMap<String, Vec<Value>> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinyloop-serve"))
        .arg(fixture())
        .args(["--workers", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start tinyloop-serve");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if sender.send(line.expect("read a response")).is_err() {
                return;
            }
        }
    });
    for request in requests {
        writeln!(stdin, "{request}").unwrap();
    }
    drop(stdin); // end of input: the service answers what it has and exits

    let mut responses: HashMap<String, Vec<Value>> = HashMap::new();
    for _ in 0..requests.len() {
        let line = match receiver.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("no response within a minute; got {responses:?}");
            }
        };
        let response: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"));
        responses.entry(response["id"].to_string()).or_default().push(response);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "the service exited with {status}");
    assert!(receiver.recv_timeout(Duration::from_secs(5)).is_err(), "more responses than requests");
    responses
}

/// serde_json's default float parser may be off in the last bit, so equality is to 1e-12.
fn assert_close(actual: &Value, expected: f64, what: &str) {
    let actual = actual.as_f64().unwrap_or_else(|| panic!("{what}: {actual} is not a number"));
    assert!((actual - expected).abs() <= 1e-12 * expected.abs(), "{what}: {actual} vs {expected}");
}

fn error_of<'a>(responses: &'a HashMap<String, Vec<Value>>, id: &str) -> (&'a str, &'a str) {
    let response = &responses[id][0];
    assert!(response.get("perplexity").is_none(), "{response}");
    (response["error"]["kind"].as_str().unwrap(), response["error"]["message"].as_str().unwrap())
}

#[test]
fn good_and_bad_requests_get_scores_and_clear_errors() {
    let model = Model::load(fixture()).unwrap();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("seed {seed}");
    let tokens: Vec<Vec<i32>> = (0..24u64)
        .map(|r| (0..(20 + r * 7)).map(|i| ((seed >> (r % 40)).wrapping_add(i * 31 + r) % 256) as i32).collect())
        .collect();
    let text = "The service keeps serving after bad requests.";

    let mut requests: Vec<String> =
        tokens.iter().enumerate().map(|(i, t)| json!({"id": i, "tokens": t}).to_string()).collect();
    requests.extend([
        json!({"id": "text", "text": text}).to_string(),
        "{\"id\": \"broken\", \"tokens\": [1, 2,".to_owned(),
        json!({"id": "range", "tokens": [1, 2, 999, 4]}).to_string(),
        json!({"id": "missing"}).to_string(),
        json!({"id": "typed", "tokens": [1, "two", 3]}).to_string(),
        json!({"id": "short", "tokens": [5]}).to_string(),
        json!({"id": "window", "tokens": [1, 2, 3], "window": 1}).to_string(),
        json!({"id": "after", "text": text}).to_string(),
    ]);
    let responses = serve(&requests);

    let options = ScoreOptions { threads: 1, ..ScoreOptions::default() };
    for (i, t) in tokens.iter().enumerate() {
        let expected = model.score(t, &options).unwrap();
        let response = &responses[&i.to_string()][0];
        assert_close(&response["perplexity"], expected.perplexity, &format!("request {i}: {response}"));
        assert_eq!(response["tokens_scored"].as_u64().unwrap(), expected.tokens_scored);
    }
    let text_tokens: Vec<i32> = text.bytes().map(i32::from).collect();
    let expected = model.score(&text_tokens, &options).unwrap().perplexity;
    for id in ["\"text\"", "\"after\""] {
        assert_close(&responses[id][0]["perplexity"], expected, id);
    }

    let (kind, message) = error_of(&responses, "null");
    assert_eq!(kind, "bad_json", "{message}");
    let (kind, message) = error_of(&responses, "\"range\"");
    assert_eq!(kind, "invalid_argument");
    assert!(message.contains("999") || message.contains("token"), "{message}");
    let (kind, message) = error_of(&responses, "\"missing\"");
    assert_eq!(kind, "bad_request");
    assert!(message.contains("missing field"), "{message}");
    let (kind, message) = error_of(&responses, "\"typed\"");
    assert_eq!(kind, "bad_request");
    assert!(message.contains("tokens[1]"), "{message}");
    assert_eq!(error_of(&responses, "\"short\"").0, "invalid_argument");
    assert_eq!(error_of(&responses, "\"window\"").0, "invalid_argument");
}

/// The command line (clap): --help and --version print and exit 0, a usage error exits 2 naming the problem, a
/// model that does not load exits 1.
#[test]
fn help_version_and_usage_errors() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tinyloop-serve"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tinyloop-serve")
    };
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let help = run(&["--help"]);
    let help_text = text(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{help_text}");
    for needle in ["Usage: tinyloop-serve", "<MODEL>", "--workers <N>", "--version", "\"tokens\": [1, 2, 3]"] {
        assert!(help_text.contains(needle), "--help lacks {needle:?}:\n{help_text}");
    }
    let version = run(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert!(text(&version.stdout).starts_with("tinyloop-serve 0."), "{}", text(&version.stdout));

    let model = fixture().display().to_string();
    for (args, needle) in [
        (vec![], "<MODEL>"),
        (vec![model.as_str(), "--workers"], "--workers"),
        (vec![model.as_str(), "--workers", "0"], "\"0\" is not a positive integer"),
        (vec![model.as_str(), "--workers", "many"], "\"many\" is not a positive integer"),
        (vec![model.as_str(), "--frobnicate"], "--frobnicate"),
        (vec![model.as_str(), "second-model"], "second-model"),
    ] {
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
    }
    let missing = run(&["no-such-model.tinyloop"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("cannot load no-such-model.tinyloop"), "{}", text(&missing.stderr));
}
