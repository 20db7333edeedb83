// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: the Stager's check of a stream it is given (bind, finish, order_after_uploads), on a
// backend that can tell whether its device may use the stream (StreamCheckBackend).

#include <string_view>
#include <type_traits>

#include "devstage/backend.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage::detail {

/// Ok, or the backend's refusal of `stream` as the error of the stager call `call`. Backends
/// without the check, and a synchronous backend's immediate stream, pass.
template <class B, class S>
Status check_stream(B& backend, const S& stream, std::string_view call) noexcept {
    if constexpr (StreamCheckBackend<B>) {
        if constexpr (std::is_same_v<S, typename B::Stream>) {
            Status checked = backend.check_stream(stream);
            if (checked) return checked;
            return Status(checked.code(), message("stager ", call, ": ", checked.message()));
        }
    }
    (void)backend, (void)stream, (void)call;
    return {};
}

}  // namespace devstage::detail
