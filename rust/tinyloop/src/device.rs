//! CUDA devices, streams and typed device buffers, through the library's own device helpers (`tl_device_malloc`,
//! `tl_memcpy`, `tl_stream_create`, …), so a caller needs no CUDA runtime of its own.
//!
//! Ordering rule that makes these types safe: every buffer belongs to one [`Stream`], and every operation on it
//! (upload, download, fill, use by [`quant_gemm`](crate::quant_gemm), the final free) is queued on that stream,
//! whose FIFO order then keeps the device from ever reading memory that is being written or freed.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use tinyloop_sys as sys;

use crate::error::{check, Error, Result};
use crate::to_c_int;

/// A CUDA device, by 0-based index. Cheap to copy: it only names the device, which is checked when it is used
/// ([`Error::NoDevice`] where there is no usable GPU or no CUDA in the build, [`Error::InvalidArgument`] for an
/// index past the last device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    index: usize,
}

/// What [`Device::info`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's name, e.g. `"NVIDIA H200"`.
    pub name: String,
    /// Compute capability, major part (9 for an H100/H200).
    pub sm_major: u32,
    /// Compute capability, minor part.
    pub sm_minor: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Free device memory in bytes when the call was made.
    pub free_memory: u64,
    /// Whether this library's Marlin-class kernel runs on the device (SM 8.0 or newer).
    pub marlin_supported: bool,
}

impl Device {
    /// Number of usable CUDA devices: 0 (not an error) in a build without CUDA or on a machine without a GPU.
    pub fn count() -> Result<usize> {
        let mut count = 0i32;
        // SAFETY: `count` is writable.
        check(unsafe { sys::tl_device_count(&mut count) })?;
        crate::to_usize(count, "device count")
    }

    /// The device with this 0-based index (not checked until it is used).
    pub fn new(index: usize) -> Device {
        Device { index }
    }

    /// The device's 0-based index.
    pub fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn raw_index(&self) -> Result<i32> {
        to_c_int(self.index, "device index")
    }

    /// The device's name, compute capability, SM count and memory.
    pub fn info(&self) -> Result<DeviceInfo> {
        // SAFETY: tl_device_properties is integers and a char array, for which all-zero bytes are valid.
        let mut props: sys::tl_device_properties = unsafe { std::mem::zeroed() };
        props.struct_size = std::mem::size_of::<sys::tl_device_properties>() as u32;
        // SAFETY: `props` is writable with its size set.
        check(unsafe { sys::tl_device_info(self.raw_index()?, &mut props) })?;
        // The library NUL-terminates the name; the last byte is forced to NUL in case a future one does not.
        props.name[props.name.len() - 1] = 0;
        // SAFETY: the array is NUL-terminated within its bounds (see above).
        let name = unsafe { CStr::from_ptr(props.name.as_ptr()) }.to_string_lossy().into_owned();
        Ok(DeviceInfo {
            name,
            sm_major: crate::to_usize(props.sm_major, "sm_major")? as u32,
            sm_minor: crate::to_usize(props.sm_minor, "sm_minor")? as u32,
            sm_count: crate::to_usize(props.sm_count, "sm_count")? as u32,
            total_memory: props.total_memory,
            free_memory: props.free_memory,
            marlin_supported: props.marlin_supported != 0,
        })
    }
}

/// Logs an error from a destructor, which has no caller to return it to and must not panic.
pub(crate) fn report_drop_error(what: &str, error: &Error) {
    log::error!("tinyloop: {what} failed: {error}");
}

/// Owns a `cudaStream_t` from `tl_stream_create` and destroys it when the last [`Stream`] handle or buffer on
/// it is gone.
struct StreamInner {
    raw: NonNull<c_void>,
    device: Device,
}

// SAFETY: a cudaStream_t has no thread affinity; the only operations on it are CUDA runtime calls
// (enqueue, synchronize, destroy), which are thread-safe. Two threads enqueuing on one stream are serialised by
// the runtime, and each buffer's own operations keep their order because its owner (Send, not Sync) issues them
// from one thread at a time.
unsafe impl Send for StreamInner {}
// SAFETY: as for Send: `&StreamInner` only ever reaches thread-safe CUDA runtime calls.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        // SAFETY: the stream is owned and destroyed exactly once; no buffer on it is left (each holds an Arc).
        if let Err(error) = check(unsafe { sys::tl_stream_destroy(self.raw.as_ptr()) }) {
            report_drop_error("tl_stream_destroy", &error);
        }
    }
}

/// A non-blocking CUDA stream on one device; destroyed on drop (work already queued still completes).
///
/// Buffers and workspaces made on a stream keep it alive until they are freed on it. `Stream` is `Send` and
/// `Sync`: every operation on it is a thread-safe CUDA runtime call.
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("raw", &self.inner.raw).field("device", &self.inner.device).finish()
    }
}

impl Stream {
    /// Creates a non-blocking stream on `device`. [`Error::NoDevice`] without a usable GPU.
    pub fn new(device: &Device) -> Result<Stream> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is writable.
        check(unsafe { sys::tl_stream_create(device.raw_index()?, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::Internal("tl_stream_create succeeded with NULL".into()))?;
        Ok(Stream { inner: Arc::new(StreamInner { raw, device: *device }) })
    }

    /// The device the stream runs on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Waits until all work queued on the stream is done; errors of that work (a failed kernel) surface here.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        check(unsafe { sys::tl_stream_synchronize(self.inner.raw.as_ptr()) })
    }

    pub(crate) fn raw(&self) -> *mut c_void {
        self.inner.raw.as_ptr()
    }

    /// Whether two handles name the same stream.
    pub(crate) fn same_as(&self, shared: &SharedStream) -> bool {
        Arc::ptr_eq(&self.inner, &shared.0)
    }

    pub(crate) fn share(&self) -> SharedStream {
        SharedStream(Arc::clone(&self.inner))
    }
}

/// A reference to a stream held by what lives on it (buffers, workspaces).
#[derive(Clone)]
pub(crate) struct SharedStream(Arc<StreamInner>);

impl SharedStream {
    fn raw(&self) -> *mut c_void {
        self.0.raw.as_ptr()
    }
}

impl fmt::Debug for SharedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Stream").field(&self.0.raw).finish()
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types a [`DeviceBuffer`] may hold: plain numbers, for which every bit pattern is a valid value, so
/// that whatever the device holds can be read back safely. Sealed: implemented for the integer and float types
/// and [`half::f16`] / [`half::bf16`] (FP16 / BF16, `#[repr(transparent)]` over their `u16` bit patterns, as the
/// device's `__half` / `__nv_bfloat16` are).
pub trait DeviceCopy: sealed::Sealed + Copy + Send + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceCopy for $t {}
    )*};
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, half::f16, half::bf16);

/// A typed array in device memory on one [`Stream`]'s device, of a fixed length, freed on drop.
///
/// Allocated with `tl_device_malloc`; uploads and downloads go through `tl_memcpy` on the buffer's stream and
/// return when the copy is done; the free on drop is queued on the stream after everything the buffer was used
/// for, and a failure there is logged (through the `log` crate), never a panic. FP16 data is a
/// `DeviceBuffer<`[`f16`](crate::f16)`>`.
///
/// `Send` (it can move to another thread with its stream), not `Sync`:
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<tinyloop::DeviceBuffer<tinyloop::f16>>();
/// ```
pub struct DeviceBuffer<T: DeviceCopy> {
    /// NULL for an empty buffer (nothing is allocated).
    ptr: *mut c_void,
    len: usize,
    stream: SharedStream,
    _element: PhantomData<T>,
}

// SAFETY: the buffer owns its allocation exclusively; device memory and its stream have no thread affinity.
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}

impl<T: DeviceCopy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("element", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates `len` elements on the stream's device without initialising them (they are filled before use).
    fn alloc(stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("device buffer of {len} elements: the size overflows usize"))
        })?;
        let mut ptr = ptr::null_mut();
        if bytes > 0 {
            // SAFETY: `ptr` is writable.
            check(unsafe { sys::tl_device_malloc(stream.device().raw_index()?, bytes, &mut ptr) })?;
        }
        Ok(DeviceBuffer { ptr, len, stream: stream.share(), _element: PhantomData })
    }

    /// A buffer of `len` zeros on `stream`'s device.
    pub fn zeroed(stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        let mut buffer = DeviceBuffer::alloc(stream, len)?;
        buffer.fill_bytes(0)?;
        Ok(buffer)
    }

    /// A buffer holding a copy of `data` on `stream`'s device.
    pub fn from_slice(stream: &Stream, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buffer = DeviceBuffer::alloc(stream, data.len())?;
        buffer.upload(data)?;
        Ok(buffer)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Whether the buffer lives on `stream` (so it may be used in work queued there).
    pub fn is_on(&self, stream: &Stream) -> bool {
        stream.same_as(&self.stream)
    }

    /// The device pointer (NULL for an empty buffer), for passing to the C API.
    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut c_void {
        self.ptr
    }

    fn check_len(&self, other: usize, what: &str) -> Result<()> {
        if other == self.len {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{what}: the host slice has {other} elements, the device buffer {}",
            self.len
        )))
    }

    /// Copies `data` (exactly [`len`](Self::len) elements) into the buffer, after all work queued on its stream;
    /// returns when the copy is done.
    pub fn upload(&mut self, data: &[T]) -> Result<()> {
        self.check_len(data.len(), "upload")?;
        // SAFETY: the buffer holds bytes() bytes, as does `data`; tl_memcpy returns after the copy completes,
        // so `data` need not outlive the call; `&mut self` excludes any other host-side use of the buffer. The
        // bytes are T's own representation: for `half::f16`, `#[repr(transparent)]` over u16, the IEEE half bit
        // patterns the device's FP16 code reads.
        check(unsafe { sys::tl_memcpy(self.ptr, data.as_ptr().cast(), self.bytes(), self.stream.raw()) })
    }

    /// Copies the buffer into `out` (exactly [`len`](Self::len) elements), after all work queued on its stream;
    /// returns when the copy is done.
    pub fn download(&self, out: &mut [T]) -> Result<()> {
        self.check_len(out.len(), "download")?;
        // SAFETY: `out` holds bytes() writable bytes and every bit pattern is a valid T (DeviceCopy; any u16 is a
        // valid `half::f16`, which is `#[repr(transparent)]` over it); the copy is complete when tl_memcpy returns.
        check(unsafe { sys::tl_memcpy(out.as_mut_ptr().cast(), self.ptr, self.bytes(), self.stream.raw()) })
    }

    /// The buffer's contents as a vector (a [`download`](Self::download) into a new vector).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        // SAFETY: DeviceCopy types are plain integers and floats (f16 included), for which all-zero bytes are a
        // valid value.
        let zero: T = unsafe { std::mem::zeroed() };
        let mut out = vec![zero; self.len];
        self.download(&mut out)?;
        Ok(out)
    }

    /// Sets every byte of the buffer to `value`, queued on its stream (returns without waiting). Handy to
    /// poison an output before a kernel writes it: `0xff` bytes are NaN in FP16 and FP32.
    pub fn fill_bytes(&mut self, value: u8) -> Result<()> {
        // SAFETY: the buffer holds bytes() bytes of device memory; the fill is ordered on its stream.
        check(unsafe { sys::tl_memset_device(self.ptr, i32::from(value), self.bytes(), self.stream.raw()) })
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: the allocation is owned and freed exactly once, queued on the stream after all its uses; the
        // stream lives at least until this returns (held by `self.stream`).
        if let Err(error) = check(unsafe { sys::tl_device_free(self.ptr, self.stream.raw()) }) {
            report_drop_error("tl_device_free", &error);
        }
    }
}
