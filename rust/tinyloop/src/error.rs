//! The crate's error type: one variant per C status, each with the message the library left for the thread.

use std::ffi::CStr;
use std::fmt;

use tinyloop_sys as sys;

/// A failed TinyLoop call: what kind of failure (one variant per `TL_ERR_*` status) and the message that
/// names the argument, tensor or file at fault.
///
/// For failures reported by the C library the message is the calling thread's `tl_last_error_message()`,
/// read right after the failing call; arguments this crate rejects itself (a slice of the wrong length, a
/// string with a NUL byte) give [`Error::InvalidArgument`] with a message written here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `TL_ERR_INVALID_ARGUMENT`: an argument is out of range or inconsistent with another.
    InvalidArgument(String),
    /// `TL_ERR_OUT_OF_MEMORY`: host or device memory could not be allocated.
    OutOfMemory(String),
    /// `TL_ERR_IO`: a file could not be opened, mapped, read or written.
    Io(String),
    /// `TL_ERR_FORMAT`: a model file is malformed.
    Format(String),
    /// `TL_ERR_UNSUPPORTED`: valid, but this build or object does not support it.
    Unsupported(String),
    /// `TL_ERR_NO_DEVICE`: a GPU was requested but none is usable, or the build has no CUDA support.
    NoDevice(String),
    /// `TL_ERR_CUDA`: a CUDA call failed.
    Cuda(String),
    /// `TL_ERR_INTERNAL`: a bug in the library (or a broken promise of the C API seen by this crate).
    Internal(String),
    /// `TL_ERR_BUFFER_TOO_SMALL`: a buffer is smaller than required.
    BufferTooSmall(String),
    /// `TL_ERR_NOT_FOUND`: a lookup by name or index found nothing.
    NotFound(String),
    /// `TL_ERR_CANCELLED`: a progress callback asked to stop.
    Cancelled(String),
    /// A status this crate does not know (from a newer library), with its value and message.
    Unknown(i32, String),
}

/// `Result` with [`Error`] as the error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The C status value (`TL_ERR_*`) this error stands for.
    pub fn status(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => sys::TL_ERR_INVALID_ARGUMENT,
            Error::OutOfMemory(_) => sys::TL_ERR_OUT_OF_MEMORY,
            Error::Io(_) => sys::TL_ERR_IO,
            Error::Format(_) => sys::TL_ERR_FORMAT,
            Error::Unsupported(_) => sys::TL_ERR_UNSUPPORTED,
            Error::NoDevice(_) => sys::TL_ERR_NO_DEVICE,
            Error::Cuda(_) => sys::TL_ERR_CUDA,
            Error::Internal(_) => sys::TL_ERR_INTERNAL,
            Error::BufferTooSmall(_) => sys::TL_ERR_BUFFER_TOO_SMALL,
            Error::NotFound(_) => sys::TL_ERR_NOT_FOUND,
            Error::Cancelled(_) => sys::TL_ERR_CANCELLED,
            Error::Unknown(status, _) => *status,
        }
    }

    /// The detailed message (which argument, tensor or file, and what is wrong with it).
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::OutOfMemory(m)
            | Error::Io(m)
            | Error::Format(m)
            | Error::Unsupported(m)
            | Error::NoDevice(m)
            | Error::Cuda(m)
            | Error::Internal(m)
            | Error::BufferTooSmall(m)
            | Error::NotFound(m)
            | Error::Cancelled(m)
            | Error::Unknown(_, m) => m,
        }
    }

    /// The error for a C status, with `message`.
    fn from_status(status: i32, message: String) -> Error {
        match status {
            sys::TL_ERR_INVALID_ARGUMENT => Error::InvalidArgument(message),
            sys::TL_ERR_OUT_OF_MEMORY => Error::OutOfMemory(message),
            sys::TL_ERR_IO => Error::Io(message),
            sys::TL_ERR_FORMAT => Error::Format(message),
            sys::TL_ERR_UNSUPPORTED => Error::Unsupported(message),
            sys::TL_ERR_NO_DEVICE => Error::NoDevice(message),
            sys::TL_ERR_CUDA => Error::Cuda(message),
            sys::TL_ERR_INTERNAL => Error::Internal(message),
            sys::TL_ERR_BUFFER_TOO_SMALL => Error::BufferTooSmall(message),
            sys::TL_ERR_NOT_FOUND => Error::NotFound(message),
            sys::TL_ERR_CANCELLED => Error::Cancelled(message),
            other => Error::Unknown(other, message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: tl_status_string accepts any value and returns a static, NUL-terminated string.
        let kind = unsafe { CStr::from_ptr(sys::tl_status_string(self.status())) };
        write!(f, "{}: {}", kind.to_string_lossy(), self.message())
    }
}

impl std::error::Error for Error {}

/// `Ok(())` for `TL_OK`; otherwise the error for `status` with the calling thread's last error message. Call
/// it right after the C call, on the same thread, before any other call into the library.
pub(crate) fn check(status: i32) -> Result<()> {
    if status == sys::TL_OK {
        return Ok(());
    }
    // SAFETY: tl_last_error_message never returns NULL; the text stays valid until the next call into the
    // library on this thread, and it is copied before that.
    let message = unsafe { CStr::from_ptr(sys::tl_last_error_message()) };
    Err(Error::from_status(status, message.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_its_variant() {
        for status in -11..=-1 {
            let error = Error::from_status(status, format!("message {status}"));
            assert!(!matches!(error, Error::Unknown(..)), "status {status} has no variant");
            assert_eq!(error.status(), status);
            assert_eq!(error.message(), format!("message {status}"));
        }
        let unknown = Error::from_status(-1000, "from a newer library".into());
        assert_eq!(unknown, Error::Unknown(-1000, "from a newer library".into()));
        assert_eq!(unknown.status(), -1000);
    }

    #[test]
    fn display_names_the_kind_and_the_detail() {
        let text = Error::NotFound("no weight named \"x\"".into()).to_string();
        assert!(text.ends_with(": no weight named \"x\""), "{text}");
        assert!(text.len() > ": no weight named \"x\"".len(), "the kind is missing: {text}");
    }
}
