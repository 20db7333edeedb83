// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: TeardownList, the teardown hooks of a backend (TeardownBackend): added and removed
// by the holders of its memory, run once each, the last added first, before the backend's
// device or context goes. Thread-safe; a hook runs without the list's lock, and removing a
// hook that is running in another thread waits until it returned.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage::detail {

class TeardownList {
public:
    TeardownList() noexcept = default;
    TeardownList(const TeardownList&) = delete;
    TeardownList& operator=(const TeardownList&) = delete;

    Result<std::uint64_t> add(TeardownHook hook, std::string_view backend) noexcept {
        if (hook.function == nullptr) {
            return Status(Errc::invalid_argument, message(backend, " add_teardown_hook: the hook has no function"));
        }
        std::lock_guard lock(mutex_);
        const std::uint64_t id = next_ + 1;
#if defined(__cpp_exceptions)
        try {
            hooks_.push_back(Entry{id, hook});
        } catch (const std::bad_alloc&) {
            return Status(Errc::out_of_memory, "add_teardown_hook: host memory exhausted");
        }
#else
        hooks_.push_back(Entry{id, hook});
#endif
        next_ = id;
        return id;
    }

    void remove(std::uint64_t id) noexcept {
        std::unique_lock lock(mutex_);
        for (auto it = hooks_.begin(); it != hooks_.end(); ++it) {
            if (it->id == id) {
                hooks_.erase(it);
                return;
            }
        }
        if (running_ == id && runner_ != std::this_thread::get_id()) {
            idle_.wait(lock, [&] { return running_ != id; });
        }
    }

    /// Runs every hook once, the last added first (hooks added meanwhile too).
    void run_all() noexcept {
        std::unique_lock lock(mutex_);
        while (!hooks_.empty()) {
            const Entry entry = hooks_.back();
            hooks_.pop_back();
            running_ = entry.id;
            runner_ = std::this_thread::get_id();
            lock.unlock();
            entry.hook.function(entry.hook.user);
            lock.lock();
            running_ = 0;
            idle_.notify_all();
        }
    }

    std::size_t size() const noexcept {
        std::lock_guard lock(mutex_);
        return hooks_.size();
    }

private:
    struct Entry {
        std::uint64_t id;
        TeardownHook hook;
    };
    mutable std::mutex mutex_;
    std::condition_variable idle_;
    std::vector<Entry> hooks_;
    std::uint64_t next_ = 0;
    std::uint64_t running_ = 0;
    std::thread::id runner_;
};

}  // namespace devstage::detail
