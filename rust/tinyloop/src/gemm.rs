//! The GPU side of quantized weights: packing them onto a device, the INT4 x FP16 GEMM dispatcher, its
//! process-wide settings and per-weight counters, and the workspace a GEMM call needs.

use std::ptr::{self, NonNull};

use tinyloop_sys as sys;

use crate::device::{DeviceBuffer, SharedStream, Stream};
use crate::error::{check, Error, Result};
use crate::model::Model;
use crate::weight::{Weight, WeightInfo, WeightRef};
use crate::{to_c_int, Device};

mod sealed {
    use std::ptr::NonNull;

    pub trait Sealed {
        fn raw(&self) -> NonNull<tinyloop_sys::tl_weight>;
    }
}

/// A quantized weight that can take part in [`quant_gemm`]: an owned [`Weight`] or a [`WeightRef`] borrowed
/// from a [`Model`]. Sealed: only this crate's weight types implement it.
pub trait QuantWeight: sealed::Sealed {
    /// The weight's shape and storage facts.
    fn info(&self) -> &WeightInfo;

    /// Dequantizes on the host into a row-major `[n][k]` matrix: `out[j * k + i] = W[i, j]`.
    fn dequantize(&self) -> Result<Vec<f32>>;

    /// Bytes of device workspace [`quant_gemm`] needs for this weight at this `m` (0 is possible; it depends on
    /// the dispatcher settings too). The weight must have been packed ([`Error::NoDevice`] without a GPU,
    /// [`Error::InvalidArgument`] if it was not packed).
    fn workspace_size(&self, m: usize) -> Result<usize> {
        let mut bytes = 0usize;
        let m = i64::try_from(m).map_err(|_| Error::InvalidArgument(format!("m = {m} does not fit in an int64_t")))?;
        // SAFETY: the weight is live for the borrow of self; `bytes` is writable.
        check(unsafe { sys::tl_quant_gemm_workspace_size(self.raw().as_ptr(), m, &mut bytes) })?;
        Ok(bytes)
    }

    /// How often each dispatcher path ran for this weight since it was packed.
    fn dispatch_counts(&self) -> Result<DispatchCounts> {
        // SAFETY: tl_dispatch_counts is integers, for which all-zero bytes are valid.
        let mut counts: sys::tl_dispatch_counts = unsafe { std::mem::zeroed() };
        counts.struct_size = std::mem::size_of::<sys::tl_dispatch_counts>() as u32;
        // SAFETY: the weight is live; `counts` is writable with its size set.
        check(unsafe { sys::tl_weight_dispatch_counts(self.raw().as_ptr(), &mut counts) })?;
        Ok(DispatchCounts {
            fp16_body: counts.fp16_body,
            marlin_fused: counts.marlin_fused,
            marlin_correction: counts.marlin_correction,
            dequant_cublas: counts.dequant_cublas,
            native: counts.native,
            fallbacks: counts.fallbacks,
        })
    }
}

impl sealed::Sealed for Weight {
    fn raw(&self) -> NonNull<sys::tl_weight> {
        Weight::raw(self)
    }
}

impl QuantWeight for Weight {
    fn info(&self) -> &WeightInfo {
        Weight::info(self)
    }
    fn dequantize(&self) -> Result<Vec<f32>> {
        Weight::dequantize(self)
    }
}

impl sealed::Sealed for WeightRef<'_> {
    fn raw(&self) -> NonNull<sys::tl_weight> {
        WeightRef::raw(self)
    }
}

impl QuantWeight for WeightRef<'_> {
    fn info(&self) -> &WeightInfo {
        WeightRef::info(self)
    }
    fn dequantize(&self) -> Result<Vec<f32>> {
        WeightRef::dequantize(self)
    }
}

/// Per-path call counts of a packed weight ([`QuantWeight::dispatch_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchCounts {
    /// Calls served by the FP16 body through cuBLAS.
    pub fp16_body: u64,
    /// Calls served by the Marlin-class kernel, fused form (zero point applied in registers).
    pub marlin_fused: u64,
    /// Calls served by the Marlin-class kernel, symmetric form plus the delta correction.
    pub marlin_correction: u64,
    /// Calls served by dequantize-to-FP16 + cuBLAS.
    pub dequant_cublas: u64,
    /// Calls served by the native INT4 kernel.
    pub native: u64,
    /// Calls in which a path refused and a later one ran instead.
    pub fallbacks: u64,
}

impl DispatchCounts {
    /// Calls made in all, whichever path served them.
    pub fn total(&self) -> u64 {
        self.fp16_body + self.marlin_fused + self.marlin_correction + self.dequant_cublas + self.native
    }
}

/// Which device forms packing builds besides the file's own INT4 layout, which is always uploaded (the native
/// kernel's input, the fallback every weight has). `Default` is the library's: both Marlin-class forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackForms {
    /// Marlin-class tiles with the zero point applied in registers (`q * s + z`).
    pub marlin_fused: bool,
    /// The seed's form: symmetric tiles plus the `delta = z + 8s` correction.
    pub marlin_correction: bool,
    /// A dequantized FP16 copy fed to cuBLAS (memory for speed).
    pub fp16_body: bool,
}

impl Default for PackForms {
    fn default() -> Self {
        PackForms { marlin_fused: true, marlin_correction: true, fp16_body: false }
    }
}

impl PackForms {
    pub(crate) fn to_c(self) -> u32 {
        let mut forms = 0;
        if self.marlin_fused {
            forms |= sys::TL_FORM_MARLIN_FUSED;
        }
        if self.marlin_correction {
            forms |= sys::TL_FORM_MARLIN_CORRECTION;
        }
        if self.fp16_body {
            forms |= sys::TL_FORM_FP16_BODY;
        }
        forms
    }
}

/// Options of [`Model::pack`] and [`Weight::pack`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct PackOptions<'a> {
    /// The device to upload to; `None` means the stream's device, or device 0 without a stream.
    pub device: Option<Device>,
    /// The stream for the uploads; `None` means the legacy default stream. Packing waits for its uploads either
    /// way.
    pub stream: Option<&'a Stream>,
    /// The forms to build.
    pub forms: PackForms,
}

impl PackOptions<'_> {
    fn to_c(self) -> Result<sys::tl_pack_options> {
        let stream_device = self.stream.map(Stream::device);
        let device = match (self.device, stream_device) {
            (Some(device), Some(on)) if device != on => {
                return Err(Error::InvalidArgument(format!(
                    "pack options: device {} differs from the stream's device {}",
                    device.index(),
                    on.index()
                )))
            }
            (Some(device), _) | (None, Some(device)) => device.raw_index()?,
            (None, None) => 0,
        };
        Ok(sys::tl_pack_options {
            struct_size: std::mem::size_of::<sys::tl_pack_options>() as u32,
            device,
            stream: self.stream.map_or(ptr::null_mut(), Stream::raw),
            forms: self.forms.to_c(),
        })
    }
}

/// What packing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PackReport {
    /// Quantized weights now on the device (all of them, on success).
    pub weights_uploaded: u32,
    /// Weights that received a Marlin-class form.
    pub weights_packed: u32,
    /// Weights whose shape the Marlin-class kernel does not take even with K and N padded to multiples of 64 (a group
    /// size that is not 32 or a multiple of 64, or that does not divide the padded K): they run on the native kernel.
    pub weights_not_packable: u32,
    /// Device memory held by all forms of these weights, in bytes.
    pub device_bytes: u64,
    /// Of which the Marlin-class forms and FP16 bodies, beyond the native upload.
    pub extra_device_bytes: u64,
}

impl PackReport {
    fn from_c(report: &sys::tl_pack_report) -> PackReport {
        PackReport {
            weights_uploaded: report.weights_uploaded,
            weights_packed: report.weights_packed,
            weights_not_packable: report.weights_not_packable,
            device_bytes: report.device_bytes,
            extra_device_bytes: report.extra_device_bytes,
        }
    }
}

/// Runs a packing call with C options and a report.
fn pack_with(
    options: &PackOptions<'_>,
    call: impl FnOnce(&sys::tl_pack_options, &mut sys::tl_pack_report) -> sys::tl_status,
) -> Result<PackReport> {
    let c_options = options.to_c()?;
    // SAFETY: tl_pack_report is integers, for which all-zero bytes are valid.
    let mut report: sys::tl_pack_report = unsafe { std::mem::zeroed() };
    report.struct_size = std::mem::size_of::<sys::tl_pack_report>() as u32;
    check(call(&c_options, &mut report))?;
    Ok(PackReport::from_c(&report))
}

impl Model {
    /// Uploads every quantized weight to the device and packs the requested forms (built on the host) for
    /// those the Marlin-class kernel takes. Run once after loading; packing again replaces earlier packs, all
    /// or nothing. `&mut self`: no other use of the model may overlap it. [`Error::NoDevice`] without a GPU.
    pub fn pack(&mut self, options: &PackOptions<'_>) -> Result<PackReport> {
        let raw = self.raw();
        // SAFETY: the model is live and exclusively borrowed; options and report are valid for the call.
        pack_with(options, |c_options, report| unsafe { sys::tl_pack_marlin(raw.as_ptr(), c_options, report) })
    }
}

impl Weight {
    /// Uploads this owned weight to the device and packs the requested forms, like [`Model::pack`] does for a
    /// model's weights. [`Error::NoDevice`] without a GPU.
    pub fn pack(&mut self, options: &PackOptions<'_>) -> Result<PackReport> {
        let raw = Weight::raw(self);
        // SAFETY: the weight is owned and exclusively borrowed; options and report are valid for the call.
        pack_with(options, |c_options, report| unsafe { sys::tl_weight_pack_marlin(raw.as_ptr(), c_options, report) })
    }
}

/// Device scratch memory for [`quant_gemm`] on one stream: sized by the library's query for each call, grown
/// (never shrunk) when a call needs more, zero-filled once when allocated (the library leaves it zero-filled
/// after each call).
///
/// Tied to one stream because the C API forbids one workspace to serve two calls that can run at the same time:
/// calls queued on one stream never overlap, and `&mut` keeps two host threads from sharing it. `Send`, not
/// `Sync`:
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<tinyloop::Workspace>();
/// ```
#[derive(Debug)]
pub struct Workspace {
    buffer: Option<DeviceBuffer<u8>>,
    stream: SharedStream,
}

impl Workspace {
    /// An empty workspace on `stream` (nothing allocated until a call needs it).
    pub fn new(stream: &Stream) -> Workspace {
        Workspace { buffer: None, stream: stream.share() }
    }

    /// Bytes allocated now.
    pub fn bytes(&self) -> usize {
        self.buffer.as_ref().map_or(0, DeviceBuffer::bytes)
    }

    /// Whether the workspace serves calls queued on `stream`.
    pub fn is_on(&self, stream: &Stream) -> bool {
        stream.same_as(&self.stream)
    }

    /// Grows the workspace to what a call on `weight` with `m` rows needs, if it is smaller. The old memory is
    /// freed on the stream after the calls already queued that use it.
    pub fn reserve<W: QuantWeight + ?Sized>(&mut self, weight: &W, m: usize, stream: &Stream) -> Result<()> {
        if !self.is_on(stream) {
            return Err(Error::InvalidArgument("the workspace belongs to another stream".into()));
        }
        let needed = weight.workspace_size(m)?;
        if needed > self.bytes() {
            self.buffer = Some(DeviceBuffer::zeroed(stream, needed)?);
        }
        Ok(())
    }
}

/// The element types [`quant_gemm`] takes for its activations and results: [`f16`](crate::f16) (FP16) and
/// [`bf16`](crate::bf16) (BF16). Sealed.
pub trait GemmElement: crate::DeviceCopy + private::Sealed {
    /// The C API's `TL_DTYPE_*` value of the type.
    #[doc(hidden)]
    const DTYPE: i32;
}
mod private {
    pub trait Sealed {}
}
impl private::Sealed for half::f16 {}
impl private::Sealed for half::bf16 {}
impl GemmElement for half::f16 {
    const DTYPE: i32 = sys::TL_DTYPE_FP16;
}
impl GemmElement for half::bf16 {
    const DTYPE: i32 = sys::TL_DTYPE_BF16;
}

/// `Y = X · W` on the GPU: `x` holds `[m][k]` row-major, `y` receives `[m][n]` row-major, both FP16
/// ([`f16`](crate::f16)) or both BF16 ([`bf16`](crate::bf16); `tl_quant_gemm_dtype`, whose header comment says how
/// each path rounds). The weight must have been packed on the stream's device ([`Model::pack`] /
/// [`Weight::pack`]).
///
/// Checked here before the library is called: `m >= 1`, `x.len() == m * k`, `y.len() == m * n`, and that `x`,
/// `y` and `workspace` all live on `stream` ([`Error::InvalidArgument`] otherwise). The workspace grows if the
/// call needs more. The call is queued on `stream` and returns without waiting: [`DeviceBuffer::download`] (or
/// [`Stream::synchronize`]) waits for it. The dispatcher tries the FP16 body, then the Marlin-class kernel (or
/// dequantize + cuBLAS), then the native INT4 kernel (see [`DispatchSetting`]); the result is the same whichever
/// ran. Any number of threads may run calls on one shared weight, each with its own buffers and workspace.
///
/// Freeing a packed weight (dropping a [`Weight`] or [`Model`]) while calls on it are still queued is safe: the
/// library frees device memory with `cudaFree`, which waits for the device first.
pub fn quant_gemm<W: QuantWeight + ?Sized, E: GemmElement>(
    weight: &W,
    x: &DeviceBuffer<E>,
    y: &mut DeviceBuffer<E>,
    m: usize,
    stream: &Stream,
    workspace: &mut Workspace,
) -> Result<()> {
    let info = weight.info();
    let shape = |what: &str, actual: usize, width: usize, name: &str| -> Result<()> {
        match m.checked_mul(width) {
            Some(expected) if expected == actual => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "quant_gemm on '{}': {what} has {actual} elements, m = {m} times {name} = {width} is not that",
                info.name
            ))),
        }
    };
    if m == 0 {
        return Err(Error::InvalidArgument(format!("quant_gemm on '{}': m must be >= 1", info.name)));
    }
    shape("x", x.len(), info.k, "k")?;
    shape("y", y.len(), info.n, "n")?;
    if !x.is_on(stream) || !y.is_on(stream) {
        return Err(Error::InvalidArgument(format!(
            "quant_gemm on '{}': x and y must live on the stream the call is queued on",
            info.name
        )));
    }
    workspace.reserve(weight, m, stream)?;
    let (workspace_ptr, workspace_bytes) =
        workspace.buffer.as_mut().map_or((ptr::null_mut(), 0), |b| (b.as_mut_ptr(), b.bytes()));
    let m = i64::try_from(m).map_err(|_| Error::InvalidArgument(format!("m = {m} does not fit in an int64_t")))?;
    // SAFETY: the weight is live; x, y and the workspace are device allocations of the checked sizes on
    // `stream`, so everything later queued on them (copies, frees) runs after this call; `&mut y` and
    // `&mut workspace` exclude other host-side writers while the call is queued. x and y hold `half::f16` or
    // `half::bf16` elements, `#[repr(transparent)]` over u16: the bit patterns of the type E::DTYPE names.
    check(unsafe {
        sys::tl_quant_gemm_dtype(
            weight.raw().as_ptr(),
            E::DTYPE,
            x.as_ptr(),
            y.as_mut_ptr(),
            m,
            stream.raw(),
            workspace_ptr,
            workspace_bytes,
        )
    })
}

/// A setting of the GEMM dispatcher. Each [`Model`](crate::Model) and owned [`Weight`](crate::Weight) carries its own
/// ([`Model::set_dispatch`](crate::Model::set_dispatch)); a setting a handle has not set follows the process-wide
/// default ([`set_dispatch`]). The library reads no environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchSetting {
    /// 1 (default where the kernel runs) / 0: use the Marlin-class kernel.
    UseMarlin,
    /// 0 (default) / 1: use a weight's FP16 body (if packed) first.
    Fp16Body,
    /// 0 (default) / 1: cross-iteration rounding for looped weights with frac4/sign-bit channels.
    CrossIterRound,
    /// Which Marlin-class form: 0 = the faster (default), 1 = fused, 2 = correction.
    MarlinMode,
    /// M from which dequantize + cuBLAS replaces the Marlin-class kernel (default 512; 0 = never); weights with
    /// K·N ≤ 2^25 (2^24 on compute capability 9.0) switch at the smaller of this and 128, on 9.0 other weights at
    /// 4× this, and weights with K·N ≥ 2^27 at twice that.
    CublasMinM,
    /// GPU scoring's attention: 0 (default) the tensor-core kernel where it runs, 1 the FP32 SIMT kernel.
    Attention,
}

impl DispatchSetting {
    /// Every setting, in the C API's order.
    pub const ALL: [DispatchSetting; 6] = [
        DispatchSetting::UseMarlin,
        DispatchSetting::Fp16Body,
        DispatchSetting::CrossIterRound,
        DispatchSetting::MarlinMode,
        DispatchSetting::CublasMinM,
        DispatchSetting::Attention,
    ];

    pub(crate) fn to_c(self) -> i32 {
        match self {
            DispatchSetting::UseMarlin => sys::TL_DISPATCH_USE_MARLIN,
            DispatchSetting::Fp16Body => sys::TL_DISPATCH_FP16_BODY,
            DispatchSetting::CrossIterRound => sys::TL_DISPATCH_CROSS_ITER_ROUND,
            DispatchSetting::MarlinMode => sys::TL_DISPATCH_MARLIN_MODE,
            DispatchSetting::CublasMinM => sys::TL_DISPATCH_CUBLAS_MIN_M,
            DispatchSetting::Attention => sys::TL_DISPATCH_ATTENTION,
        }
    }
}

/// Sets the process-wide default of a dispatcher setting, which every handle that has not set its own follows
/// ([`Error::InvalidArgument`] for a value out of its range). Calls already under way use the old value. Works in every build (without CUDA it only affects later GPU
/// calls, which there are none of).
pub fn set_dispatch(setting: DispatchSetting, value: u32) -> Result<()> {
    let value = to_c_int(value as usize, "dispatch value")?;
    // SAFETY: plain values.
    check(unsafe { sys::tl_set_dispatch(setting.to_c(), value) })
}

/// Reads the process-wide default of a dispatcher setting.
pub fn get_dispatch(setting: DispatchSetting) -> Result<u32> {
    let mut value = 0i32;
    // SAFETY: `value` is writable.
    check(unsafe { sys::tl_get_dispatch(setting.to_c(), &mut value) })?;
    crate::to_usize(value, "dispatch value").map(|v| v as u32)
}
