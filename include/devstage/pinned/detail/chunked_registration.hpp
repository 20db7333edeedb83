// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: ChunkedRegistration, existing host memory pinned in place (a backend's
/// host_register) in chunks — a single registration of hundreds of gigabytes fails on some
/// drivers and kernels, and holds their locks for minutes — in the calling thread or in
/// background threads, with progress, cancellation, and a rollback of every chunk when one
/// fails or the work is cancelled. It pins only; the caller maps and unmaps the memory.
/// Thread-safe: threads claim chunks with an atomic counter; the last one to stop finishes
/// (rolls back if it must, then calls the completion).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "devstage/backend.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/pinned/regions.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

template <class B>
class ChunkedRegistration {
public:
    /// Called once, by the thread that finishes, with the outcome: ok when every chunk is
    /// registered; else the first failure (or the cancellation), everything rolled back.
    using Completion = std::function<void(const Status&)>;

    /// [base, base + length) in chunks of `chunk` bytes (the last may be shorter).
    ChunkedRegistration(B& backend, void* base, std::size_t length, std::size_t chunk)
        : backend_(&backend),
          base_(static_cast<std::byte*>(base)),
          length_(length),
          chunk_(chunk == 0 ? length : chunk),
          chunks_(chunk_ == 0 ? 0 : (length + chunk_ - 1) / chunk_),
          registered_(chunks_, 0) {}
    ChunkedRegistration(const ChunkedRegistration&) = delete;
    ChunkedRegistration& operator=(const ChunkedRegistration&) = delete;
    /// Cancels and joins threads still running.
    ~ChunkedRegistration() {
        cancel();
        join();
    }

    std::size_t chunks() const noexcept { return chunks_; }
    std::size_t chunk_bytes() const noexcept { return chunk_; }

    /// Registers every chunk in the calling thread; the outcome, as a completion would get it.
    Status run() noexcept {
        active_.store(1, std::memory_order_relaxed);
        work();
        return finish_status();
    }

    /// Registers in `threads` (>= 1) background threads; `done` is called by the last one.
    /// When no thread can be started, nothing is registered and the error is returned (`done`
    /// is not called); when only some can, those do the work.
    Status start(unsigned threads, Completion done) noexcept {
        done_ = std::move(done);
        active_.store(threads, std::memory_order_relaxed);
        unsigned started = 0;
        for (unsigned i = 0; i < threads; ++i) {
            const bool ok = start_thread([this] {
                work();
                if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
            });
            if (!ok) break;
            ++started;
        }
        if (started == threads) return {};
        // The threads that did not start will not finish: their share goes away. If none
        // started, the completion is not called and nothing was registered.
        const unsigned missing = threads - started;
        if (active_.fetch_sub(missing, std::memory_order_acq_rel) == missing) {
            if (started == 0) {
                return Status(Errc::out_of_memory, "pinned region: no registration thread could be started");
            }
            finish();
        }
        return {};
    }

    /// Stops claiming chunks; what was registered is rolled back when the threads stop.
    void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
    bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

    /// Joins the background threads (not from one of them).
    void join() noexcept {
        std::vector<std::thread> threads;
        {
            std::lock_guard lock(threads_mutex_);
            threads.swap(threads_);
        }
        for (std::thread& thread : threads) {
            if (thread.joinable()) thread.join();
        }
    }

    RegionProgress progress() const noexcept {
        RegionProgress out;
        out.bytes_registered = bytes_registered_.load(std::memory_order_relaxed);
        out.bytes_total = length_;
        out.chunks_registered = chunks_registered_.load(std::memory_order_relaxed);
        out.chunks_total = chunks_;
        out.cancel_requested = cancelled();
        return out;
    }

    /// Unregisters every chunk (all registered: after a successful finish). A chunk that fails
    /// to unregister stays registered and the first failure is returned; a later call retries
    /// only the chunks still registered.
    Status unregister_all() noexcept {
        Status first;
        for (std::size_t i = 0; i < chunks_; ++i) {
            if (registered_[i] == 0) continue;
            if (Status undone = unregister_one(base_ + i * chunk_); !undone) {
                if (first.ok()) first = std::move(undone);
                continue;
            }
            registered_[i] = 0;
            chunks_registered_.fetch_sub(1, std::memory_order_relaxed);
            bytes_registered_.fetch_sub(length_of(i), std::memory_order_relaxed);
        }
        return first;
    }

private:
    std::size_t length_of(std::size_t i) const noexcept { return i + 1 < chunks_ ? chunk_ : length_ - i * chunk_; }

    Status register_one(void* at, std::size_t bytes) noexcept {
        if constexpr (HostRegisterBackend<B>) {
            return backend_->host_register(at, bytes);
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", backend_->name(),
                                                                "' cannot pin memory in place (no host_register)"));
        }
    }
    Status unregister_one(void* at) noexcept {
        if constexpr (HostRegisterBackend<B>) {
            return backend_->host_unregister(at);
        } else {
            return Status(Errc::not_supported, message_or_empty("backend '", backend_->name(),
                                                                "' cannot pin memory in place (no host_unregister)"));
        }
    }

    void work() noexcept {
        for (;;) {
            if (cancelled_.load(std::memory_order_relaxed) || failed_.load(std::memory_order_relaxed)) return;
            const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
            if (i >= chunks_) return;
            Status registered = register_one(base_ + i * chunk_, length_of(i));
            if (!registered) {
                std::lock_guard lock(failure_mutex_);
                if (failure_.ok()) {
                    failure_ = Status(registered.code(),
                                      message_or_empty("host_register of chunk ", i + 1, " of ", chunks_, " (",
                                                       length_of(i), " bytes at offset ", i * chunk_, " of ", length_,
                                                       ") failed: ", registered.message()));
                }
                failed_.store(true, std::memory_order_relaxed);
                return;
            }
            registered_[i] = 1;  // this thread's chunk; read after every thread stopped
            chunks_registered_.fetch_add(1, std::memory_order_relaxed);
            bytes_registered_.fetch_add(length_of(i), std::memory_order_relaxed);
        }
    }

    /// Precondition: every thread stopped. The outcome, after a rollback when it failed or was
    /// cancelled.
    Status finish_status() noexcept {
        Status outcome;
        {
            std::lock_guard lock(failure_mutex_);
            outcome = failure_;
        }
        if (outcome.ok() && cancelled_.load(std::memory_order_relaxed) &&
            chunks_registered_.load(std::memory_order_relaxed) < chunks_) {
            outcome =
                Status(Errc::invalid_argument, message_or_empty("the registration was cancelled after ",
                                                                chunks_registered_.load(), " of ", chunks_, " chunks"));
        }
        if (outcome.ok()) return outcome;
        if (Status undone = unregister_all(); !undone) {
            return Status(outcome.code(), message_or_empty(outcome.message(), "; rolling back failed too: ",
                                                           undone.message(), " (those chunks stay registered)"));
        }
        return outcome;
    }

    void finish() noexcept {
        const Status outcome = finish_status();
        if (done_) done_(outcome);
    }

    template <class F>
    bool start_thread(F&& body) noexcept {
        std::lock_guard lock(threads_mutex_);
#if defined(__cpp_exceptions)
        try {
            threads_.emplace_back(std::forward<F>(body));
        } catch (const std::system_error&) {
            return false;
        } catch (const std::bad_alloc&) {
            return false;
        }
#else
        threads_.emplace_back(std::forward<F>(body));
#endif
        return true;
    }

    B* backend_;
    std::byte* base_;
    std::size_t length_;
    std::size_t chunk_;
    std::size_t chunks_;
    std::vector<unsigned char> registered_;  ///< per chunk; each written by the thread that claimed it
    std::atomic<std::size_t> next_{0};
    std::atomic<unsigned> active_{0};
    std::atomic<bool> cancelled_{false};
    std::atomic<bool> failed_{false};
    std::atomic<std::size_t> chunks_registered_{0};
    std::atomic<std::size_t> bytes_registered_{0};
    std::mutex failure_mutex_;
    Status failure_;
    Completion done_;
    std::mutex threads_mutex_;
    std::vector<std::thread> threads_;
};

}  // namespace devstage::detail
