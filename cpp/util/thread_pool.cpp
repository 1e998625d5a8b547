#include "util/thread_pool.hpp"

#include <string>
#include <system_error>

#include "util/error.hpp"
#include "util/log.hpp"

namespace tl {

ThreadPool::ThreadPool(int32_t n_threads) {
    constexpr int32_t kMaxThreads = 1024;  // far above any useful count; stops a typo from starting millions
    if (n_threads < 0 || n_threads > kMaxThreads) {
        fail(TL_ERR_INVALID_ARGUMENT,
             "n_threads = " + std::to_string(n_threads) + " is outside [0, " + std::to_string(kMaxThreads) + "]");
    }
    if (n_threads == 0) n_threads = static_cast<int32_t>(std::thread::hardware_concurrency());
    if (n_threads < 1) n_threads = 1;  // hardware_concurrency() may return 0 when it cannot tell
    try {
        for (int32_t w = 1; w < n_threads; ++w) workers_.emplace_back(&ThreadPool::worker_main, this, w);
    } catch (const std::system_error &e) {
        // Fewer threads only makes the call slower, never wrong.
        log(TL_LOG_WARN, "thread pool: started " + std::to_string(workers_.size() + 1) + " of " +
                             std::to_string(n_threads) + " threads (" + e.what() + ")");
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    start_cv_.notify_all();
    for (std::thread &t : workers_) t.join();
}

void ThreadPool::run_tasks(int32_t worker) {
    for (;;) {
        if (failed_.load(std::memory_order_relaxed)) return;
        const size_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
        if (i >= n_tasks_) return;
        try {
            (*task_)(i, worker);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
}

void ThreadPool::worker_main(int32_t worker) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
            if (stopping_) return;
            seen = generation_;
        }
        run_tasks(worker);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (--busy_ == 0) done_cv_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(size_t n_tasks, const std::function<void(size_t, int32_t)> &task) {
    if (n_tasks == 0) return;
    if (workers_.empty() || n_tasks == 1) {  // waking workers would cost more than it saves
        for (size_t i = 0; i < n_tasks; ++i) task(i, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        task_ = &task;
        n_tasks_ = n_tasks;
        next_task_.store(0, std::memory_order_relaxed);
        failed_.store(false, std::memory_order_relaxed);
        error_ = nullptr;
        busy_ = static_cast<int32_t>(workers_.size());
        ++generation_;
    }
    start_cv_.notify_all();
    run_tasks(0);
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_cv_.wait(lock, [&] { return busy_ == 0; });
        task_ = nullptr;
        error = error_;
        error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
}

}  // namespace tl
