//! The library's log lines, delivered to a Rust closure.
//!
//! The C callback runs while the library holds its log lock and must not call back into the library; a Rust
//! closure cannot be held to that. So the C callback only queues each line on a channel, and the closure runs
//! on a delivery thread of its own, where it may do anything (including calling this crate).

use std::ffi::{c_void, CStr};
use std::os::raw::c_char;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Sender};
use std::sync::Mutex;

use tinyloop_sys as sys;

use crate::error::{check, Error, Result};

/// How important a log line is; the order is from most to least important.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Something failed.
    Error,
    /// Something unexpected that the library worked around (a fallback, an ignored setting).
    Warn,
    /// Milestones: packing done, the first Marlin-class dispatch.
    Info,
    /// Detail for debugging.
    Debug,
}

impl LogLevel {
    fn to_c(self) -> i32 {
        match self {
            LogLevel::Error => sys::TL_LOG_ERROR,
            LogLevel::Warn => sys::TL_LOG_WARN,
            LogLevel::Info => sys::TL_LOG_INFO,
            LogLevel::Debug => sys::TL_LOG_DEBUG,
        }
    }

    fn from_c(level: i32) -> LogLevel {
        match level {
            sys::TL_LOG_ERROR => LogLevel::Error,
            sys::TL_LOG_WARN => LogLevel::Warn,
            sys::TL_LOG_INFO => LogLevel::Info,
            // Finer levels a newer library may add are debugging detail too.
            _ => LogLevel::Debug,
        }
    }
}

/// Where the C callback queues lines; `None` while no closure is installed. Never held while calling into the
/// library (the C side holds its own lock while it calls the trampoline, which takes this one).
static SINK: Mutex<Option<Sender<(LogLevel, String)>>> = Mutex::new(None);

unsafe extern "C" fn log_trampoline(_user_data: *mut c_void, level: i32, message: *const c_char) {
    // Nothing may unwind into C; a poisoned lock or a failed send only loses the line.
    let _ = panic::catch_unwind(AssertUnwindSafe(|| {
        if message.is_null() {
            return;
        }
        // SAFETY: the library passes a NUL-terminated line valid for this call; it is copied here.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        if let Ok(sink) = SINK.lock() {
            if let Some(sender) = sink.as_ref() {
                let _ = sender.send((LogLevel::from_c(level), text));
            }
        }
    }));
}

/// Sends the library's log lines up to `max_level` to `callback`, replacing any earlier callback (lines already
/// queued still reach the earlier one). The library logs for the whole process, so this is process-wide too.
///
/// `callback` runs on a delivery thread that this call starts, in the order the lines were logged, shortly after
/// each is logged; it may call this crate. A panic in it is caught and loses only that line.
pub fn set_log_callback<F>(max_level: LogLevel, callback: F) -> Result<()>
where
    F: Fn(LogLevel, &str) + Send + 'static,
{
    let (sender, receiver) = mpsc::channel::<(LogLevel, String)>();
    std::thread::Builder::new()
        .name("tinyloop-log".into())
        .spawn(move || {
            for (level, line) in receiver {
                let _ = panic::catch_unwind(AssertUnwindSafe(|| callback(level, &line)));
            }
        })
        .map_err(|e| Error::OutOfMemory(format!("cannot start the log delivery thread: {e}")))?;
    // The sender is in place before the library can call the trampoline.
    replace_sink(Some(sender));
    // SAFETY: the trampoline is a valid callback for the whole process lifetime and needs no user data.
    let status = unsafe { sys::tl_set_log_callback(Some(log_trampoline), std::ptr::null_mut(), max_level.to_c()) };
    if let Err(error) = check(status) {
        replace_sink(None);
        return Err(error);
    }
    Ok(())
}

/// Stops delivering log lines (the default). Lines already queued are still delivered; the delivery thread ends
/// after them.
pub fn clear_log_callback() -> Result<()> {
    // SAFETY: a NULL callback turns logging off.
    check(unsafe { sys::tl_set_log_callback(None, std::ptr::null_mut(), sys::TL_LOG_ERROR) })?;
    replace_sink(None);
    Ok(())
}

/// Swaps the sink; dropping the old sender ends the old delivery thread once it has drained its queue.
fn replace_sink(sender: Option<Sender<(LogLevel, String)>>) {
    let old = match SINK.lock() {
        Ok(mut sink) => std::mem::replace(&mut *sink, sender),
        // A panic while holding the lock cannot leave the Option half-written: reuse it.
        Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), sender),
    };
    drop(old);
}
