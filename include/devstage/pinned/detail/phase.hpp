// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Private: PinnedPhase, where a pinned pool's core is in its life — open (it hands out memory),
/// closed (the pool was destroyed: nothing more is handed out, nothing more is cached) or torn
/// down (its backend went: also no work may be recorded on its memory). The phase only moves
/// forward. Not thread-safe: the core reads and changes it under its mutex.

#include <cstdint>
#include <string>

#include "devstage/pinned/detail/host_memory.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

class PinnedPhase {
public:
    enum class Stage : std::uint8_t { open, closed, torn_down };

    /// `caching`: whether the pool's cache policy keeps released blocks at all.
    explicit PinnedPhase(bool caching) noexcept : caching_(caching) {}

    Stage stage() const noexcept { return stage_; }
    bool closed() const noexcept { return stage_ != Stage::open; }
    bool torn_down() const noexcept { return stage_ == Stage::torn_down; }
    /// Whether a released block may wait in the cache now.
    bool cacheable() const noexcept { return caching_ && stage_ == Stage::open; }

    /// The pool was destroyed (a pool torn down already stays torn down).
    void close() noexcept {
        if (stage_ == Stage::open) stage_ = Stage::closed;
    }
    /// The pool's backend is being torn down.
    void tear_down() noexcept { stage_ = Stage::torn_down; }

    /// Ok while the pool hands out memory; else why not, naming the backend `name`.
    Status refusal(const std::string& name) const noexcept {
        switch (stage_) {
            case Stage::open:
                return {};
            case Stage::closed:
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool allocate: the pool was destroyed (backend '", name, "')"));
            case Stage::torn_down:
                return Status(Errc::invalid_argument,
                              message_or_empty("pinned pool allocate: backend '", name,
                                               "' was torn down (its device or context is gone): the pool hands out "
                                               "nothing more"));
        }
        return {};
    }

private:
    bool caching_;
    Stage stage_ = Stage::open;
};

}  // namespace devstage::detail
