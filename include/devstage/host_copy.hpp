// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// HostCopyPool: a fixed set of host threads that split one large memcpy between them and the
/// calling thread. Started once (never per copy); a pool of 0 threads copies on the caller.
/// The pageable ring of a Stager fills its pinned chunks with it.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace devstage {

/// Host threads for large copies. `HostCopyPool pool(8); pool.copy(dst, src, bytes);`
/// copy() may be called from any thread; concurrent calls take turns. Threads that cannot be
/// started (the system refuses) leave a smaller pool: threads() tells.
class HostCopyPool {
public:
    /// Pieces below this size are not split further: a thread hand-off costs more.
    static constexpr std::size_t min_piece = std::size_t{256} << 10;

    explicit HostCopyPool(std::size_t threads = 0) noexcept {
        workers_.reserve(threads);
        for (std::size_t i = 0; i < threads; ++i) {
#if defined(__cpp_exceptions)
            try {
                workers_.emplace_back([this] { work(); });
            } catch (...) {
                break;  // the system refused a thread: the pool is smaller
            }
#else
            workers_.emplace_back([this] { work(); });
#endif
        }
    }
    HostCopyPool(const HostCopyPool&) = delete;
    HostCopyPool& operator=(const HostCopyPool&) = delete;
    ~HostCopyPool() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (std::thread& worker : workers_) worker.join();
    }

    /// The threads beside the caller.
    std::size_t threads() const noexcept {
        return workers_.size();
    }

    /// Copies `bytes` from `src` to `dst` (not overlapping), split between the pool's threads
    /// and the caller; returns when every byte is copied.
    void copy(void* dst, const void* src, std::size_t bytes) noexcept {
        const std::size_t pieces = std::min(workers_.size() + 1, std::max<std::size_t>(bytes / min_piece, 1));
        if (pieces <= 1) {
            if (bytes > 0) std::memcpy(dst, src, bytes);
            return;
        }
        std::lock_guard turn(turn_);  // one copy at a time uses the workers
        {
            std::lock_guard lock(mutex_);
            job_ = Job{static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, pieces};
            next_.store(0, std::memory_order_relaxed);
            done_ = 0;
            ++generation_;
        }
        wake_.notify_all();
        const std::size_t mine = run_pieces(job_);
        std::unique_lock lock(mutex_);
        done_ += mine;
        // Every piece copied, and no worker still holds this job (it could otherwise take a
        // piece of the next one with this one's pointers).
        finished_.wait(lock, [this] { return done_ == job_.pieces && active_ == 0; });
    }

private:
    struct Job {
        std::byte* dst = nullptr;
        const std::byte* src = nullptr;
        std::size_t bytes = 0;
        std::size_t pieces = 0;
    };

    // Copies pieces until none is left; returns how many this thread copied.
    std::size_t run_pieces(const Job& job) noexcept {
        std::size_t copied = 0;
        const std::size_t step = (job.bytes + job.pieces - 1) / job.pieces;
        for (std::size_t piece = next_.fetch_add(1); piece < job.pieces; piece = next_.fetch_add(1)) {
            const std::size_t begin = piece * step;
            const std::size_t end = std::min(job.bytes, begin + step);
            if (begin < end) std::memcpy(job.dst + begin, job.src + begin, end - begin);
            ++copied;
        }
        return copied;
    }

    void work() noexcept {
        std::uint64_t seen = 0;
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
            if (stopping_) return;
            seen = generation_;
            const Job job = job_;
            ++active_;
            lock.unlock();
            const std::size_t copied = run_pieces(job);
            lock.lock();
            done_ += copied;
            --active_;
            if (done_ == job.pieces && active_ == 0) finished_.notify_all();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex turn_;
    std::mutex mutex_;
    std::condition_variable wake_, finished_;
    Job job_;
    std::atomic<std::size_t> next_{0};
    std::size_t done_ = 0;
    std::size_t active_ = 0;  // workers holding the current job
    std::uint64_t generation_ = 0;
    bool stopping_ = false;
};

}  // namespace devstage
