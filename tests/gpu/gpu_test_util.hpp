// Shared helpers of the GPU parity tests: device buffers, random INT4 weights and activations, the FP64 host
// reference and the comparison. Every test draws fresh random inputs (the seed is printed), poisons its outputs
// with 0xFFFF (an FP16 NaN) before each run and checks every element and every CUDA return code.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/gemm_policy.hpp"

namespace tlt {

extern bool g_quick;  // --quick: small shapes only (compute-sanitizer runs)
std::mt19937_64 &rng();

// A device array of T; `ok()` is false if cudaMalloc failed (tests assert it).
template <class T>
class DeviceBuffer {
public:
    explicit DeviceBuffer(size_t count) : count_(count) {
        status_ = cudaMalloc(reinterpret_cast<void **>(&ptr_), count * sizeof(T) + 16);
    }
    ~DeviceBuffer() {
        if (ptr_ != nullptr) cudaFree(ptr_);
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    bool ok() const { return status_ == cudaSuccess; }
    T *get() const { return ptr_; }
    size_t count() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }
    cudaError_t upload(const std::vector<T> &host) {
        return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
    cudaError_t download(std::vector<T> &host) const {
        host.resize(count_);
        return cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    }
    cudaError_t poison() { return cudaMemset(ptr_, 0xFF, count_ * sizeof(T)); }  // FP16 0xFFFF is a NaN

private:
    T *ptr_ = nullptr;
    size_t count_ = 0;
    cudaError_t status_ = cudaSuccess;
};

// INT4 weights in the file's layout: codes [n][ceil(k/2)], scales/zeros [n][G] FP16 bits, W = q*s + z.
struct Int4Weight {
    int k = 0, n = 0, group_size = 0;
    std::vector<uint8_t> codes;
    std::vector<uint16_t> scales, zeros;
    int groups() const { return (k + group_size - 1) / group_size; }
    int row_bytes() const { return (k + 1) / 2; }
    double at(int kk, int nn) const;  // W[kk, nn] in FP64
};

// Random codes; s ~ U(0.004, 0.02), z ~ -s * U(6, 9) (weights straddle zero like min-max quantized ones).
Int4Weight random_weight(int k, int n, int group_size);
// FP16 bits of N(0, 1) samples.
std::vector<uint16_t> random_normal_half(size_t count, double stddev = 1.0);
// FP16 bits of N(0, 1) samples rounded to BF16 (8 significant bits; magnitudes below 2^-14 flushed to zero), so that
// each value is exact in both types: one FP64 reference serves an FP16 and a BF16 call (bf16_bits converts).
std::vector<uint16_t> random_normal_both(size_t count);
// The BF16 bits of FP16 values (exact for random_normal_both's values).
std::vector<uint16_t> bf16_bits(const std::vector<uint16_t> &fp16);
// BF16 <-> FP32 on the host (round to nearest even).
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float f);
// The value of FP16 or BF16 bits.
double decode(uint16_t bits, tl::Dtype dtype);

// ref[m][c] = sum_k x[m, k] * W[k, cols[c]] in FP64 (multi-threaded); cols empty = all columns.
std::vector<double> reference_gemm(const std::vector<uint16_t> &x, int m, const Int4Weight &w,
                                   const std::vector<int> &cols);
// `count` distinct random columns of [0, n), sorted (all of them when count >= n).
std::vector<int> sample_columns(int n, int count);

// Every element of y [m][n] (FP16 bits) is finite; on the columns `cols` (empty = all) of the reference
// ref[m][cols.size()], ||y - ref|| / ||ref|| <= rel_tol and each element within 4 * rel_tol * rms(ref) +
// 2e-3 * |ref| (1.6e-2 * |ref| for BF16; a single misplaced element fails even where the norm would not notice); y's
// elements of `dtype`.
::testing::AssertionResult matches(const std::vector<uint16_t> &y, int m, int n, const std::vector<double> &ref,
                                   const std::vector<int> &cols, double rel_tol, tl::Dtype dtype = tl::Dtype::F16);
// The same against another output of the same type (all columns).
::testing::AssertionResult matches_half(const std::vector<uint16_t> &y, const std::vector<uint16_t> &ref, int m,
                                        int n, double rel_tol, tl::Dtype dtype = tl::Dtype::F16);
// ||y - ref|| / ||ref|| over all of y [m][n] against the FP64 reference on every column (NaN if an element is not
// finite).
double relative_error(const std::vector<uint16_t> &y, int m, int n, const std::vector<double> &ref, tl::Dtype dtype);

int sm_count();
// Whether the sm_90a kernels (wgmma, TMA) run here: the library holds them and the device is compute capability 9.0.
bool sm90a_kernels_run();

}  // namespace tlt

#define CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call
