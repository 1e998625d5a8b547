//! The log callback. Its own test binary (so its own process): the library logs one debug line per scoring call,
//! which is what this test makes it write.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fixture;
use tinyloop::{clear_log_callback, set_log_callback, Backend, LogLevel, Model, ScoreOptions};

fn wait_for(lines: &Mutex<Vec<(LogLevel, String)>>, count: usize) -> Vec<(LogLevel, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = lines.lock().unwrap().clone();
        if seen.len() >= count || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn library_lines_reach_the_callback_which_may_call_the_library_and_panic() {
    let model = Model::load(fixture()).unwrap();
    let options = ScoreOptions { backend: Backend::Cpu, ..ScoreOptions::default() };
    let tokens: Vec<i32> = (0..20).collect();

    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    set_log_callback(LogLevel::Debug, move |level, line| {
        // Calling the library from the callback is allowed here (the closure runs on its own thread).
        assert!(!tinyloop::build_info().is_empty());
        let first = {
            let mut seen = sink.lock().unwrap();
            seen.push((level, line.to_owned()));
            seen.len() == 1
        };
        if first {
            panic!("a panicking callback loses only its own line");
        }
    })
    .unwrap();

    // Each CPU scoring call writes one debug line: the first makes the callback panic, the second still arrives.
    model.score(&tokens, &options).unwrap();
    model.score(&tokens, &options).unwrap();
    let seen = wait_for(&lines, 2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (level, line) in &seen {
        assert_eq!(*level, LogLevel::Debug);
        assert!(line.starts_with("[score] CPU: 19 tokens"), "{seen:?}");
    }

    // Replacing and clearing succeed; without a callback nothing more arrives.
    set_log_callback(LogLevel::Debug, |_, _| {}).unwrap();
    clear_log_callback().unwrap();
    clear_log_callback().unwrap();
    model.score(&tokens, &options).unwrap();
    assert_eq!(lines.lock().unwrap().len(), 2);
}
