//! Quantized INT4 weights: borrowed from a model ([`WeightRef`]) or owned ([`Weight`]).

use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use half::f16;
use tinyloop_sys as sys;

use crate::error::{check, Error, Result};
use crate::gemm::DispatchSetting;
use crate::{to_c_int, to_usize};

/// Shape and storage facts of a quantized weight `W[k, n] = q * s + z` (K input features, N output features).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightInfo {
    /// The weight's name (e.g. `"loop.mlp_up"`); empty if it has none.
    pub name: String,
    /// Input features: rows of W.
    pub k: usize,
    /// Output features: columns of W.
    pub n: usize,
    /// The actual group size along K (`k` for a per-row weight).
    pub group_size: usize,
    /// Groups along K (`k / group_size`).
    pub n_groups: usize,
    /// Bits per code: 4, or 8 for a model's INT8 weight (which `quant_gemm` refuses: INT8 runs on the GPU only
    /// inside a model's scoring).
    pub bits: u32,
    /// Whether the weight carries a frac4 channel (the next 4 bits below each code).
    pub has_frac4: bool,
    /// Whether the weight carries a sign-bit channel.
    pub has_sign_bit: bool,
    /// Whether the weight is borrowed from a model (a [`WeightRef`]) rather than owned (a [`Weight`]).
    pub borrowed: bool,
    /// Bytes of codes, scales, zeros and optional channels.
    pub bytes: u64,
}

impl WeightInfo {
    /// Reads the facts of a live weight.
    pub(crate) fn read(weight: NonNull<sys::tl_weight>) -> Result<WeightInfo> {
        // SAFETY: tl_weight_properties is integers and a pointer, for which all-zero bytes are valid.
        let mut props: sys::tl_weight_properties = unsafe { std::mem::zeroed() };
        props.struct_size = std::mem::size_of::<sys::tl_weight_properties>() as u32;
        // SAFETY: `weight` is live (the caller's guarantee) and `props` is a writable struct of the size set.
        check(unsafe { sys::tl_weight_info(weight.as_ptr(), &mut props) })?;
        let name = if props.name.is_null() {
            String::new()
        } else {
            // SAFETY: the name is NUL-terminated and valid while the weight lives; it is copied here.
            unsafe { CStr::from_ptr(props.name) }.to_string_lossy().into_owned()
        };
        Ok(WeightInfo {
            name,
            k: to_usize(props.k, "weight k")?,
            n: to_usize(props.n, "weight n")?,
            group_size: to_usize(props.group_size, "weight group_size")?,
            n_groups: to_usize(props.n_groups, "weight n_groups")?,
            bits: to_usize(props.bits, "weight bits")? as u32,
            has_frac4: props.has_frac4 != 0,
            has_sign_bit: props.has_sign_bit != 0,
            borrowed: props.borrowed != 0,
            bytes: props.bytes,
        })
    }
}

/// Dequantizes a live weight described by `info` into `out[n * k + i] = W[i, n]`.
fn dequantize(weight: NonNull<sys::tl_weight>, info: &WeightInfo) -> Result<Vec<f32>> {
    let len = info
        .k
        .checked_mul(info.n)
        .ok_or_else(|| Error::Internal(format!("weight {:?}: k * n overflows usize", info.name)))?;
    let mut out = vec![0.0f32; len];
    // SAFETY: `weight` is live and `out` holds exactly `len` writable floats.
    check(unsafe { sys::tl_weight_dequantize(weight.as_ptr(), out.as_mut_ptr(), out.len()) })?;
    Ok(out)
}

/// A quantized weight borrowed from a [`Model`](crate::Model); it cannot outlive the model.
#[derive(Debug, Clone, Copy)]
pub struct WeightRef<'model> {
    raw: NonNull<sys::tl_weight>,
    info: &'model WeightInfo,
    _model: PhantomData<&'model crate::Model>,
}

// SAFETY: a WeightRef is a shared borrow of a read-only weight owned by a Model, which is Sync (see model.rs);
// the C API allows any number of threads to read a loaded model's weights at once.
unsafe impl Send for WeightRef<'_> {}
// SAFETY: as for Send: every method takes `&self` and only reads the weight.
unsafe impl Sync for WeightRef<'_> {}

impl<'model> WeightRef<'model> {
    /// A borrowed weight of a model that lives for `'model`, with its facts.
    pub(crate) fn new(raw: NonNull<sys::tl_weight>, info: &'model WeightInfo) -> Self {
        WeightRef { raw, info, _model: PhantomData }
    }

    pub(crate) fn raw(&self) -> NonNull<sys::tl_weight> {
        self.raw
    }

    /// The weight's shape and storage facts.
    pub fn info(&self) -> &'model WeightInfo {
        self.info
    }

    /// The name, e.g. `"pre.0.attn_qkv"`.
    pub fn name(&self) -> &'model str {
        &self.info.name
    }

    /// Dequantizes on the host into a row-major `[n][k]` matrix: `out[j * k + i] = W[i, j]`.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        dequantize(self.raw, self.info)
    }
}

/// How [`Weight::quantize`] maps FP32 values to INT4 codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantMethod {
    /// Min-max per group: `W = q * s + z` with `z` the group's minimum (the default).
    #[default]
    Asymmetric,
    /// `W = (q - 8) * s`, stored as `z = -8 * s` so every weight follows the same formula.
    Symmetric,
}

/// Options of [`Weight::quantize`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The quantization method.
    pub method: QuantMethod,
    /// Group size along K; 0 (default) means per row (one group of size K per output column).
    pub group_size: usize,
    /// Bits per code; must be 4 (default).
    pub bits: u32,
}

impl Default for QuantizeOptions {
    fn default() -> Self {
        QuantizeOptions { method: QuantMethod::Asymmetric, group_size: 0, bits: 4 }
    }
}

impl QuantizeOptions {
    pub(crate) fn to_c(self) -> Result<sys::tl_quantize_options> {
        Ok(sys::tl_quantize_options {
            struct_size: std::mem::size_of::<sys::tl_quantize_options>() as u32,
            method: match self.method {
                QuantMethod::Asymmetric => sys::TL_QUANT_ASYMMETRIC,
                QuantMethod::Symmetric => sys::TL_QUANT_SYMMETRIC,
            },
            group_size: to_c_int(self.group_size, "group_size")?,
            bits: to_c_int(self.bits as usize, "bits")?,
        })
    }
}

/// INT4 data in host memory for [`Weight::create`], in the file's layout (docs/format.md). The arrays are
/// copied; their lengths are checked against `k`, `n` and `group_size` before the library reads them.
#[derive(Debug, Clone, Copy)]
pub struct WeightDesc<'a> {
    /// Input features (rows of W); even and > 0.
    pub k: usize,
    /// Output features (columns of W); > 0.
    pub n: usize,
    /// Group size along K; must divide `k`. 0 or `k` means per row.
    pub group_size: usize,
    /// Bits per code; must be 4.
    pub bits: u32,
    /// `[n][k/2]` bytes: the code of `W[i, j]` is in byte `j * k/2 + i/2`, low nibble for even `i`.
    pub codes: &'a [u8],
    /// `[n][k/group_size]` half-precision scales s; finite.
    pub scales: &'a [f16],
    /// `[n][k/group_size]` half-precision offsets z (`W = q * s + z`); finite.
    pub zeros: &'a [f16],
    /// Optional `[n][k/2]`: the next 4 bits below each code, in the nibble order of `codes`.
    pub frac4: Option<&'a [u8]>,
    /// Optional `[n][k/8]` (needs `k % 8 == 0`): one bit per code, bit `i % 8` of byte `j * k/8 + i/8`.
    pub sign_bit: Option<&'a [u8]>,
    /// Optional name, for messages.
    pub name: Option<&'a str>,
}

impl<'a> WeightDesc<'a> {
    /// A 4-bit description without optional channels or name.
    pub fn new(k: usize, n: usize, group_size: usize, codes: &'a [u8], scales: &'a [f16], zeros: &'a [f16]) -> Self {
        WeightDesc { k, n, group_size, bits: 4, codes, scales, zeros, frac4: None, sign_bit: None, name: None }
    }

    /// Checks that every array has exactly the length its layout needs, so the library never reads past a
    /// slice.
    fn check_lengths(&self) -> Result<()> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        if self.k == 0 || self.k % 2 != 0 || self.n == 0 {
            return invalid(format!("weight desc: k = {} must be even and > 0, n = {} must be > 0", self.k, self.n));
        }
        if self.group_size != 0 && self.k % self.group_size != 0 {
            return invalid(format!("weight desc: group_size = {} does not divide k = {}", self.group_size, self.k));
        }
        // group_size 0 means per row: one group.
        let groups = self.k.checked_div(self.group_size).unwrap_or(1);
        let expect = |what: &str, actual: usize, per_column: usize| -> Result<()> {
            match self.n.checked_mul(per_column) {
                Some(expected) if expected == actual => Ok(()),
                Some(expected) => invalid(format!(
                    "weight desc: {what} has {actual} elements, k = {} and n = {} need {expected}",
                    self.k, self.n
                )),
                None => invalid(format!("weight desc: the length of {what} overflows usize")),
            }
        };
        expect("codes", self.codes.len(), self.k / 2)?;
        expect("scales", self.scales.len(), groups)?;
        expect("zeros", self.zeros.len(), groups)?;
        if let Some(frac4) = self.frac4 {
            expect("frac4", frac4.len(), self.k / 2)?;
        }
        if let Some(sign_bit) = self.sign_bit {
            if self.k % 8 != 0 {
                return invalid(format!("weight desc: sign_bit needs k % 8 == 0, k = {}", self.k));
            }
            expect("sign_bit", sign_bit.len(), self.k / 8)?;
        }
        Ok(())
    }
}

/// An owned quantized weight, freed on drop.
#[derive(Debug)]
pub struct Weight {
    raw: NonNull<sys::tl_weight>,
    info: WeightInfo,
}

// SAFETY: an owned tl_weight is read-only after creation and has no thread affinity: the header allows
// sharing it between threads, and tl_weight_free may run on any thread.
unsafe impl Send for Weight {}
// SAFETY: every `&self` method only reads the weight, which the C API allows from many threads at once.
unsafe impl Sync for Weight {}

impl Weight {
    /// Creates an owned weight from host arrays (copied). The library validates the sizes and that every scale
    /// and zero is finite.
    pub fn create(desc: &WeightDesc<'_>) -> Result<Weight> {
        desc.check_lengths()?;
        let name = desc
            .name
            .map(|name| {
                CString::new(name)
                    .map_err(|_| Error::InvalidArgument(format!("weight desc: name {name:?} contains a NUL byte")))
            })
            .transpose()?;
        let c_desc = sys::tl_weight_desc {
            struct_size: std::mem::size_of::<sys::tl_weight_desc>() as u32,
            k: to_c_int(desc.k, "k")?,
            n: to_c_int(desc.n, "n")?,
            group_size: to_c_int(desc.group_size, "group_size")?,
            bits: to_c_int(desc.bits as usize, "bits")?,
            codes: desc.codes.as_ptr(),
            // SAFETY of the casts (the pointers are only read, by tl_weight_create below): `half::f16` is
            // `#[repr(transparent)]` over u16, so a slice of f16 is a slice of the IEEE half bit patterns
            // (`const uint16_t *`) the C API reads, with the same length, size and alignment.
            scales: desc.scales.as_ptr().cast::<u16>(),
            zeros: desc.zeros.as_ptr().cast::<u16>(),
            frac4: desc.frac4.map_or(ptr::null(), <[u8]>::as_ptr),
            sign_bit: desc.sign_bit.map_or(ptr::null(), <[u8]>::as_ptr),
            name: name.as_ref().map_or(ptr::null(), |name| name.as_ptr()),
        };
        let mut raw = ptr::null_mut();
        // SAFETY: every array pointer covers the length its layout needs (check_lengths), the name is
        // NUL-terminated, and all of them outlive the call, which copies them.
        check(unsafe { sys::tl_weight_create(&c_desc, &mut raw) })?;
        Weight::from_raw(raw, "tl_weight_create")
    }

    /// Quantizes a row-major FP32 matrix `w[n][k]` (row `j` holds `W[:, j]`, like a PyTorch Linear weight)
    /// into INT4. Values must be finite.
    pub fn quantize(w: &[f32], k: usize, n: usize, options: &QuantizeOptions) -> Result<Weight> {
        if k.checked_mul(n) != Some(w.len()) {
            return Err(Error::InvalidArgument(format!(
                "quantize: w has {} values, k = {k} times n = {n} is not that",
                w.len()
            )));
        }
        let c_options = options.to_c()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `w` holds exactly k * n floats and the options struct is fully initialised.
        check(unsafe {
            sys::tl_weight_quantize(w.as_ptr(), to_c_int(k, "k")?, to_c_int(n, "n")?, &c_options, &mut raw)
        })?;
        Weight::from_raw(raw, "tl_weight_quantize")
    }

    /// Takes ownership of a weight a successful C call returned.
    fn from_raw(raw: *mut sys::tl_weight, call: &str) -> Result<Weight> {
        let raw = NonNull::new(raw).ok_or_else(|| Error::Internal(format!("{call} succeeded with a NULL weight")))?;
        match WeightInfo::read(raw) {
            Ok(info) => Ok(Weight { raw, info }),
            Err(error) => {
                // SAFETY: the weight is owned and not yet wrapped, so nothing else frees it.
                unsafe { sys::tl_weight_free(raw.as_ptr()) };
                Err(error)
            }
        }
    }

    pub(crate) fn raw(&self) -> NonNull<sys::tl_weight> {
        self.raw
    }

    /// The weight's shape and storage facts.
    pub fn info(&self) -> &WeightInfo {
        &self.info
    }

    /// Dequantizes on the host into a row-major `[n][k]` matrix: `out[j * k + i] = W[i, j]`.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        dequantize(self.raw, &self.info)
    }

    /// Sets a dispatcher setting on this weight (its GEMMs use `value`); `None` returns it to the process-wide
    /// default. Thread-safe. [`Error::InvalidArgument`] for a value out of the setting's range.
    pub fn set_dispatch(&self, setting: DispatchSetting, value: Option<u32>) -> Result<()> {
        let value = match value {
            Some(v) => to_c_int(v as usize, "dispatch value")?,
            None => -1,
        };
        // SAFETY: the weight is live and owned; the C API makes this call safe while other threads use it.
        check(unsafe { sys::tl_weight_set_dispatch(self.raw.as_ptr(), setting.to_c(), value) })
    }

    /// The value this weight uses for a dispatcher setting: its own, else the process-wide default.
    pub fn dispatch(&self, setting: DispatchSetting) -> Result<u32> {
        let mut value = 0i32;
        // SAFETY: the weight is live and `value` writable.
        check(unsafe { sys::tl_weight_get_dispatch(self.raw.as_ptr(), setting.to_c(), &mut value) })?;
        to_usize(value, "dispatch value").map(|v| v as u32)
    }
}

impl Drop for Weight {
    fn drop(&mut self) {
        // SAFETY: the weight is owned (created by tl_weight_create/quantize) and freed exactly once.
        unsafe { sys::tl_weight_free(self.raw.as_ptr()) }
    }
}
