// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedTeardownHooks, the backends whose teardown a pinned pool's core listens to —
/// its own backend, and the backends of streams it recorded — once per backend. When one of
/// them starts to go, the handler the core gave runs with that backend. Thread-safe: its own
/// mutex guards the list (a leaf lock), and no backend call is made while holding it.

#include <cstdint>
#include <list>
#include <mutex>

#include "devstage/pinned/detail/block.hpp"
#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/status.hpp"
#include "devstage/teardown.hpp"

namespace devstage::detail {

template <class B>
class PinnedTeardownHooks {
public:
    /// What runs when a hooked backend starts to go: `handler(owner, backend)`.
    using Handler = void (*)(void* owner, B& backend) noexcept;

    PinnedTeardownHooks(Handler handler, void* owner, const PinnedSink& sink) noexcept
        : handler_(handler), owner_(owner), sink_(&sink) {}
    PinnedTeardownHooks(const PinnedTeardownHooks&) = delete;
    PinnedTeardownHooks& operator=(const PinnedTeardownHooks&) = delete;
    /// Precondition: unhook_all() ran (the backends must not call a handler of a dead owner).
    ~PinnedTeardownHooks() = default;

    /// Listens to `backend`'s teardown (nothing when it listens already). A failure to hook is
    /// reported.
    void hook(B& backend) noexcept requires TeardownBackend<B> {
        Hooked* entry = nullptr;
        {
            std::lock_guard lock(mutex_);
            for (const Hooked& hooked : hooked_) {
                if (hooked.backend == &backend) return;
            }
            if (!try_host_allocation([&] { entry = &hooked_.emplace_back(Hooked{this, &backend, 0}); })) {
                sink_->report(
                    Status(Errc::out_of_memory,
                           message_or_empty("pinned pool: host memory exhausted hooking to the teardown of backend '",
                                            backend.name(), "'")));
                return;
            }
        }
        Result<std::uint64_t> id = backend.add_teardown_hook(TeardownHook{&PinnedTeardownHooks::torn_down, entry});
        std::lock_guard lock(mutex_);
        if (id) {
            entry->id = *id;
            return;
        }
        sink_->report(
            Status(id.status().code(), message_or_empty("pinned pool: hooking to the teardown of backend '",
                                                        backend.name(), "' failed: ", id.status().message())));
        hooked_.remove_if([&](const Hooked& hooked) { return &hooked == entry; });
    }

    /// Stops listening to `backend`. The hook is removed from the backend first (which waits
    /// for it if it is running), and its entry erased after: a running hook never finds its
    /// entry gone.
    void unhook(B& backend) noexcept {
        if constexpr (TeardownBackend<B>) {
            const Hooked* entry = nullptr;
            std::uint64_t id = 0;
            {
                std::lock_guard lock(mutex_);
                for (const Hooked& hooked : hooked_) {
                    if (hooked.backend != &backend) continue;
                    entry = &hooked;
                    id = hooked.id;
                    break;
                }
            }
            if (entry == nullptr) return;
            if (id != 0) backend.remove_teardown_hook(id);
            std::lock_guard lock(mutex_);
            hooked_.remove_if([&](const Hooked& hooked) { return &hooked == entry; });
        }
    }

    void unhook_all() noexcept {
        if constexpr (TeardownBackend<B>) {
            for (;;) {
                B* backend = nullptr;
                {
                    std::lock_guard lock(mutex_);
                    if (hooked_.empty()) return;
                    backend = hooked_.front().backend;
                }
                unhook(*backend);
            }
        }
    }

    /// True while it listens to `backend` (a hook that ran stays listed until unhooked).
    bool hooked(const B& backend) const noexcept {
        std::lock_guard lock(mutex_);
        for (const Hooked& hooked : hooked_) {
            if (hooked.backend == &backend) return true;
        }
        return false;
    }

private:
    struct Hooked {
        PinnedTeardownHooks* hooks;
        B* backend;
        std::uint64_t id;  ///< the backend's id of the hook; 0 once it ran
    };

    /// The backend's teardown hook. Its entry stays until unhook() (marked run, so nothing
    /// removes it from the backend again).
    static void torn_down(void* user) noexcept {
        auto* hooked = static_cast<Hooked*>(user);
        PinnedTeardownHooks& hooks = *hooked->hooks;
        {
            std::lock_guard lock(hooks.mutex_);
            hooked->id = 0;
        }
        hooks.handler_(hooks.owner_, *hooked->backend);
    }

    Handler handler_;
    void* owner_;
    const PinnedSink* sink_;
    mutable std::mutex mutex_;  ///< hooked_
    std::list<Hooked> hooked_;  ///< stable addresses: each is the user pointer of its hook
};

}  // namespace devstage::detail
