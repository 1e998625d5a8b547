// Helpers of the GPU forward-pass tests: a device array that checks its CUDA calls and keeps a poisoned guard
// region past its end (a kernel that writes out of bounds fails the test), the shared random generator, guarded
// uploads and the launch check.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "util/half.hpp"

namespace tlt {

std::mt19937_64 &rng();  // seeded from std::random_device, seed printed by main()

constexpr size_t kGuardBytes = 4096;

// `count` elements of T plus a guard. poison(byte) fills everything, guard included; guard_intact() checks that the
// guard still holds the poison byte.
template <class T>
class DeviceArray {
public:
    explicit DeviceArray(size_t count) : count_(count) {
        status_ = cudaMalloc(reinterpret_cast<void **>(&ptr_), bytes() + kGuardBytes);
    }
    ~DeviceArray() {
        if (ptr_ != nullptr) cudaFree(ptr_);
    }
    DeviceArray(const DeviceArray &) = delete;
    DeviceArray &operator=(const DeviceArray &) = delete;

    bool ok() const { return status_ == cudaSuccess && ptr_ != nullptr; }
    T *get() const { return ptr_; }
    size_t bytes() const { return count_ * sizeof(T); }
    cudaError_t upload(const std::vector<T> &host) {
        return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
    cudaError_t download(std::vector<T> &host) const {
        host.resize(count_);
        return cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost);
    }
    cudaError_t poison(uint8_t byte) {
        poison_ = byte;
        return cudaMemset(ptr_, byte, bytes() + kGuardBytes);
    }
    bool guard_intact() const {
        std::vector<uint8_t> guard(kGuardBytes);
        if (cudaMemcpy(guard.data(), reinterpret_cast<const uint8_t *>(ptr_) + bytes(), kGuardBytes,
                       cudaMemcpyDeviceToHost) != cudaSuccess) {
            return false;
        }
        for (uint8_t b : guard) {
            if (b != poison_) return false;
        }
        return true;
    }

private:
    T *ptr_ = nullptr;
    size_t count_ = 0;
    cudaError_t status_ = cudaSuccess;
    uint8_t poison_ = 0;
};

// `count` FP16 values drawn from N(0, stddev^2).
inline std::vector<uint16_t> random_half(size_t count, double stddev) {
    std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
    std::vector<uint16_t> out(count);
    for (auto &v : out) v = tl::float_to_half(normal(rng()));
    return out;
}

// An input on the device whose guard is poisoned, so an input may be checked for stray writes too.
template <class T>
bool upload_guarded(DeviceArray<T> &a, const std::vector<T> &host) {
    return a.ok() && a.poison(0xAB) == cudaSuccess && a.upload(host) == cudaSuccess;
}

// Runs after a launcher: its rc, then the kernel's own completion.
inline ::testing::AssertionResult launched(int rc) {
    if (rc != 0) return ::testing::AssertionFailure() << "launcher rc " << rc;
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorName(err);
    return ::testing::AssertionSuccess();
}

}  // namespace tlt

#define CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call
