// A small fixed pool of worker threads for one CPU scoring call (or one forward-piece call).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tl {

class ThreadPool {
public:
    // `n_threads` (0 = hardware concurrency, at most 1024) counts the calling thread too: n_threads - 1 workers
    // are started. If the system refuses to start one, the pool runs with those it got.
    explicit ThreadPool(int32_t n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    // Threads that run tasks, the caller included; `worker` indices passed to tasks are in [0, size()).
    int32_t size() const { return static_cast<int32_t>(workers_.size()) + 1; }

    // Runs task(i, worker) for every i in [0, n_tasks) on the workers and the calling thread, and returns
    // when all have finished. The first exception a task throws is rethrown here; tasks not yet started
    // are then skipped. Not reentrant: a task must not call parallel_for on the same pool.
    void parallel_for(size_t n_tasks, const std::function<void(size_t task, int32_t worker)> &task);

private:
    void worker_main(int32_t worker);
    void run_tasks(int32_t worker);

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable start_cv_;
    std::condition_variable done_cv_;
    uint64_t generation_ = 0;  // bumped once per parallel_for; workers wait for a new value
    bool stopping_ = false;
    int32_t busy_ = 0;  // workers still inside the current generation

    const std::function<void(size_t, int32_t)> *task_ = nullptr;
    size_t n_tasks_ = 0;
    std::atomic<size_t> next_task_{0};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;
};

}  // namespace tl
