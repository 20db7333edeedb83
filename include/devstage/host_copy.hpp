// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// HostCopyPool: a fixed set of host threads that split one large memcpy between them and the
/// calling thread. Started once (never per copy); a pool of 0 threads copies on the caller.
/// The pageable ring of a Stager fills its pinned chunks with it.

#include "devstage/detail/util/cxx20.hpp"  // an older standard stops here with one error
#if DEVSTAGE_CXX20

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace devstage {

/// Host threads for large copies. `HostCopyPool pool(8); pool.copy(dst, src, bytes);`
/// copy() may be called from any thread; concurrent calls share the workers (each caller also
/// copies its own pieces). Threads that cannot be started (the system refuses) leave a smaller
/// pool: threads() tells. The pool must outlive every copy() call and every object it was
/// given to (a Stager's pageable ring keeps only a pointer to it).
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
    /// Precondition: no copy() is running.
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
    /// and the caller; returns when every byte is copied. No worker touches `dst` or `src`
    /// after it returns. Allocates nothing.
    void copy(void* dst, const void* src, std::size_t bytes) noexcept {
        const std::size_t pieces = std::min(workers_.size() + 1, std::max<std::size_t>(bytes / min_piece, 1));
        if (pieces <= 1) {
            if (bytes > 0) std::memcpy(dst, src, bytes);
            return;
        }
        // The job lives on this stack frame. Workers reach it only through the open list, and
        // only under mutex_; it leaves the list before this call waits for its holders, so once
        // holders is 0 no worker has it or can get it.
        Job job(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, pieces);
        {
            std::lock_guard lock(mutex_);
            job.next_open = open_;
            open_ = &job;
        }
        wake_.notify_all();
        job.run();
        std::unique_lock lock(mutex_);
        // Every piece is taken (run() returned), so no worker needs to find it any more.
        for (Job** link = &open_; *link != nullptr; link = &(*link)->next_open) {
            if (*link == &job) {
                *link = job.next_open;
                break;
            }
        }
        // A holder finishes the pieces it took before it lets go of the job.
        finished_.wait(lock, [&job] { return job.holders == 0; });
    }

private:
    // One copy: its pointers, the next piece to take and the workers holding it. The piece
    // counter belongs to the job, so a worker can only ever take pieces of the job it holds.
    struct Job {
        Job(std::byte* to, const std::byte* from, std::size_t size, std::size_t count) noexcept
            : dst(to), src(from), bytes(size), pieces(count), step((size + count - 1) / count) {}

        std::byte* const dst;
        const std::byte* const src;
        const std::size_t bytes;
        const std::size_t pieces;
        const std::size_t step;
        std::atomic<std::size_t> next{0};
        std::size_t holders = 0;   // workers that may still take or copy a piece (under mutex_)
        Job* next_open = nullptr;  // the open list (under mutex_)

        bool open() const noexcept { return next.load(std::memory_order_relaxed) < pieces; }
        // Copies pieces until none is left to take.
        void run() noexcept {
            for (std::size_t piece = next.fetch_add(1, std::memory_order_relaxed); piece < pieces;
                 piece = next.fetch_add(1, std::memory_order_relaxed)) {
                const std::size_t begin = piece * step;
                const std::size_t end = std::min(bytes, begin + step);
                if (begin < end) std::memcpy(dst + begin, src + begin, end - begin);
            }
        }
    };

    // The first listed job with a piece left to take, or null (under mutex_).
    Job* find_open() const noexcept {
        for (Job* job = open_; job != nullptr; job = job->next_open) {
            if (job->open()) return job;
        }
        return nullptr;
    }

    void work() noexcept {
        std::unique_lock lock(mutex_);
        for (;;) {
            Job* job = nullptr;
            wake_.wait(lock, [&] { return stopping_ || (job = find_open()) != nullptr; });
            if (stopping_) return;
            ++job->holders;
            lock.unlock();
            job->run();
            lock.lock();
            // The caller may return as soon as this is 0 (it waits under mutex_, so it cannot
            // wake before the notification below is issued and the lock is released).
            if (--job->holders == 0) finished_.notify_all();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, finished_;
    Job* open_ = nullptr;  // copies in progress that workers may help with
    bool stopping_ = false;
};

}  // namespace devstage

#endif  // DEVSTAGE_CXX20
