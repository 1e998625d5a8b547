//! A scoring service: loads a `.tinyloop` model once, then answers requests read as line-delimited JSON on
//! stdin, one JSON response per line on stdout, scoring several requests at once on a pool of workers that share
//! the model.
//!
//! ```text
//! tinyloop-serve MODEL [--workers N]
//! tinyloop-serve --help
//! ```
//!
//! Arguments are parsed with clap (Debian's librust-clap-dev, 4.0, derive): `--help` and `--version` print and exit
//! 0; a usage error prints clap's message and exits 2.
//!
//! Request (one per line): `{"id": <any JSON>, "text": "..."}` (bytes as tokens, for byte-level models) or
//! `{"id": ..., "tokens": [1, 2, 3]}`, with an optional `"window"` (tokens per scoring window).
//!
//! Response: `{"id": ..., "perplexity": 7.3, "tokens_scored": 41, "nll_sum": 81.6, "backend": "cpu"}`, or for
//! a bad request `{"id": ..., "error": {"kind": "bad_json" | "bad_request" | <library status>, "message": ...}}`
//! (`id` is null when the line was not JSON). Responses come in the order requests finish, so clients match
//! them by `id`. The service keeps serving after a bad request and exits at the end of its input.

use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use clap::Parser;
use serde_json::{json, Value};
use tinyloop::{Backend, Error, Model, ScoreOptions};

/// Why a request got no score.
struct Failure {
    kind: &'static str,
    message: String,
}

impl Failure {
    fn bad_request(message: impl Into<String>) -> Failure {
        Failure { kind: "bad_request", message: message.into() }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let kind = match error {
            Error::InvalidArgument(_) => "invalid_argument",
            Error::OutOfMemory(_) => "out_of_memory",
            Error::NoDevice(_) => "no_device",
            Error::Cuda(_) => "cuda",
            Error::Unsupported(_) => "unsupported",
            Error::Cancelled(_) => "cancelled",
            _ => "internal",
        };
        Failure { kind, message: error.to_string() }
    }
}

/// The tokens and options a request asks for.
fn parse_request(request: &Value) -> Result<(Vec<i32>, ScoreOptions), Failure> {
    let object = request.as_object().ok_or_else(|| Failure::bad_request("a request must be a JSON object"))?;
    let tokens = match (object.get("text"), object.get("tokens")) {
        (Some(Value::String(text)), None) => text.bytes().map(i32::from).collect(),
        (None, Some(Value::Array(items))) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                item.as_i64()
                    .and_then(|t| i32::try_from(t).ok())
                    .ok_or_else(|| Failure::bad_request(format!("tokens[{index}] is {item}, not a 32-bit integer")))
            })
            .collect::<Result<_, _>>()?,
        (Some(_), Some(_)) => return Err(Failure::bad_request("give either \"text\" or \"tokens\", not both")),
        (Some(_), None) => return Err(Failure::bad_request("\"text\" must be a string")),
        (None, Some(_)) => return Err(Failure::bad_request("\"tokens\" must be an array of integers")),
        (None, None) => return Err(Failure::bad_request("missing field: \"text\" or \"tokens\"")),
    };
    let window = match object.get("window") {
        None => 0,
        Some(value) => value
            .as_u64()
            .and_then(|w| usize::try_from(w).ok())
            .ok_or_else(|| Failure::bad_request(format!("\"window\" is {value}, not a non-negative integer")))?,
    };
    // One thread per request: the service's parallelism is across requests.
    Ok((tokens, ScoreOptions { threads: 1, window, ..ScoreOptions::default() }))
}

/// The response line for one request line.
fn answer(model: &Model, line: &str) -> Value {
    let request: Value = match serde_json::from_str(line) {
        Ok(request) => request,
        Err(e) => return json!({"id": null, "error": {"kind": "bad_json", "message": e.to_string()}}),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let scored = parse_request(&request).and_then(|(tokens, options)| Ok(model.score(&tokens, &options)?));
    match scored {
        Ok(result) => json!({
            "id": id,
            "perplexity": result.perplexity,
            "tokens_scored": result.tokens_scored,
            "nll_sum": result.nll_sum,
            "backend": if result.backend == Backend::Cuda { "cuda" } else { "cpu" },
        }),
        Err(failure) => json!({"id": id, "error": {"kind": failure.kind, "message": failure.message}}),
    }
}

/// A scoring service over the tinyloop crate: loads a .tinyloop model once, then answers line-delimited JSON
/// requests on stdin with one JSON response per line on stdout.
#[derive(Parser, Debug)]
#[command(
    name = "tinyloop-serve",
    version,
    after_help = "Requests, one JSON object a line: {\"id\": ..., \"text\": \"...\"} (bytes as tokens) or \
                  {\"id\": ..., \"tokens\": [1, 2, 3]}, with an optional \"window\". Responses: {\"id\", \
                  \"perplexity\", \"tokens_scored\", \"nll_sum\", \"backend\"} or {\"id\", \"error\": {\"kind\", \
                  \"message\"}}, in the order requests finish. Exit status: 0 at the end of the input (or after \
                  --help, --version), 1 when the model does not load, 2 for a usage error."
)]
struct Args {
    /// The .tinyloop model to load
    model: PathBuf,
    /// Requests scored at once, each on its own thread [default: the machine's available parallelism]
    #[arg(long, value_name = "N", value_parser = positive_count)]
    workers: Option<usize>,
}

/// `--workers`: a positive integer.
fn positive_count(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{value:?} is not a positive integer")),
    }
}

fn main() {
    // clap prints --help and --version (exit 0) and usage errors (exit 2) itself.
    let args = Args::parse();
    let workers = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let model_path = args.model.display().to_string();
    let model = match Model::load(&args.model) {
        Ok(model) => Arc::new(model),
        Err(error) => {
            eprintln!("tinyloop-serve: cannot load {model_path}: {error}");
            std::process::exit(1);
        }
    };
    eprintln!("tinyloop-serve: {model_path} loaded, {workers} workers, reading requests from stdin");

    // Workers take lines from one queue; a response is written whole under the stdout lock.
    let (sender, receiver) = mpsc::channel::<String>();
    let receiver = Arc::new(Mutex::new(receiver));
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (model, receiver) = (Arc::clone(&model), Arc::clone(&receiver));
            std::thread::spawn(move || loop {
                let line = match receiver.lock().map(|r| r.recv()) {
                    Ok(Ok(line)) => line,
                    _ => return, // input finished (or another worker panicked)
                };
                let response = answer(&model, &line).to_string();
                let mut stdout = io::stdout().lock();
                if writeln!(stdout, "{response}").and_then(|_| stdout.flush()).is_err() {
                    return; // the client went away
                }
            })
        })
        .collect();
    for line in io::stdin().lock().split(b'\n') {
        let line = match line {
            // A line that is not UTF-8 reaches a worker as text that is not JSON, and gets a bad_json answer.
            Ok(bytes) => String::from_utf8(bytes).unwrap_or_else(|_| "(a line that is not UTF-8)".to_owned()),
            Err(e) => {
                eprintln!("tinyloop-serve: reading stdin: {e}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        if sender.send(line).is_err() {
            break;
        }
    }
    drop(sender);
    for handle in handles {
        let _ = handle.join();
    }
}
