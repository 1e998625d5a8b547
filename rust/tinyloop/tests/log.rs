//! The log callback. Its own test binary (so its own process): the dispatcher settings are read from the
//! environment once per process, and two malformed values there make the library log two warnings on the CPU.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tinyloop::{clear_log_callback, get_dispatch, set_log_callback, DispatchSetting, LogLevel};

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
fn library_warnings_reach_the_callback_which_may_call_the_library_and_panic() {
    std::env::set_var("TINYLOOP_MARLIN_MODE", "sideways");
    std::env::set_var("TINYLOOP_CUBLAS_MIN_M", "-3");

    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    set_log_callback(LogLevel::Warn, move |level, line| {
        // Calling the library from the callback is allowed here (the closure runs on its own thread).
        assert!(!tinyloop::build_info().is_empty());
        sink.lock().unwrap().push((level, line.to_owned()));
        if line.contains("TINYLOOP_MARLIN_MODE") {
            panic!("a panicking callback loses only its own line");
        }
    })
    .unwrap();

    // The first read of any setting initialises them all from the environment, ignoring the bad values: the
    // mode keeps its documented default, 0 (the CUBLAS_MIN_M default is a measured value, not checked here).
    assert_eq!(get_dispatch(DispatchSetting::MarlinMode).unwrap(), 0);
    let seen = wait_for(&lines, 2);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, LogLevel::Warn);
    assert!(seen[0].1.contains("TINYLOOP_MARLIN_MODE") && seen[0].1.contains("sideways"), "{seen:?}");
    assert!(seen[1].1.contains("TINYLOOP_CUBLAS_MIN_M") && seen[1].1.contains("-3"), "{seen:?}");

    // Replacing and clearing succeed; without a callback nothing more arrives.
    set_log_callback(LogLevel::Debug, |_, _| {}).unwrap();
    clear_log_callback().unwrap();
    clear_log_callback().unwrap();
    assert_eq!(lines.lock().unwrap().len(), 2);
}
