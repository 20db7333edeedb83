// SPDX-License-Identifier: Apache-2.0
#pragma once
// The part of UCX (the UCP layer) the remote-inputs example uses, behind small RAII types: a
// context and worker able to do RMA, an endpoint to a peer's worker, memory mapped for remote
// access with its packed remote key, a peer's remote key unpacked, and a blocking put. Every
// call answers a devstage::Status naming the UCX call and UCX's own words, so a machine where UCX
// cannot start says why.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "devstage/status.hpp"

namespace ucx {

using devstage::Errc;
using devstage::Result;
using devstage::Status;

inline Status failed(const char* call, ucs_status_t status) {
    return Status(Errc::backend_failure, std::string("UCX ") + call + ": " + ucs_status_string(status));
}

/// Drives `request` (what a nonblocking UCP call returned) to its end by progressing `worker`.
inline Status wait_for(ucp_worker_h worker, ucs_status_ptr_t request, const char* call) {
    if (request == nullptr) return {};
    if (UCS_PTR_IS_ERR(request)) return failed(call, UCS_PTR_STATUS(request));
    ucs_status_t status = UCS_INPROGRESS;
    while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
    return status == UCS_OK ? Status() : failed(call, status);
}

/// A UCP context with RMA, and one worker of it (single-threaded).
class Peer {
public:
    static Result<Peer> create() {
        ucp_config_t* config = nullptr;
        if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
            return failed("ucp_config_read", s);
        }
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_RMA;
        Peer peer;
        const ucs_status_t init = ucp_init(&params, config, &peer.context_);
        ucp_config_release(config);
        if (init != UCS_OK) return failed("ucp_init", init);
        ucp_worker_params_t worker{};
        worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        worker.thread_mode = UCS_THREAD_MODE_SINGLE;
        if (ucs_status_t s = ucp_worker_create(peer.context_, &worker, &peer.worker_); s != UCS_OK) {
            return failed("ucp_worker_create", s);
        }
        return peer;
    }

    Peer(Peer&& other) noexcept
        : context_(std::exchange(other.context_, nullptr)), worker_(std::exchange(other.worker_, nullptr)) {}
    Peer& operator=(Peer&&) = delete;
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;
    ~Peer() {
        if (worker_ != nullptr) ucp_worker_destroy(worker_);
        if (context_ != nullptr) ucp_cleanup(context_);
    }

    ucp_context_h context() const noexcept { return context_; }
    ucp_worker_h worker() const noexcept { return worker_; }
    /// Lets UCX move data that arrives for this worker (RMA emulated over TCP needs the target
    /// to progress too).
    void progress() const noexcept {
        while (ucp_worker_progress(worker_) != 0) {
        }
    }

    /// This worker's address, for a peer to connect to.
    Result<std::vector<std::byte>> address() const {
        ucp_address_t* address = nullptr;
        std::size_t bytes = 0;
        if (ucs_status_t s = ucp_worker_get_address(worker_, &address, &bytes); s != UCS_OK) {
            return failed("ucp_worker_get_address", s);
        }
        const auto* begin = reinterpret_cast<const std::byte*>(address);
        std::vector<std::byte> copy(begin, begin + bytes);
        ucp_worker_release_address(worker_, address);
        return copy;
    }

private:
    Peer() = default;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
};

/// Memory of this process mapped for remote access (ucp_mem_map of existing memory), and its
/// remote key packed for a peer.
class MappedMemory {
public:
    static Result<MappedMemory> map(const Peer& peer, void* base, std::size_t bytes) {
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = base;
        params.length = bytes;
        MappedMemory mapped;
        mapped.context_ = peer.context();
        if (ucs_status_t s = ucp_mem_map(peer.context(), &params, &mapped.memory_); s != UCS_OK) {
            return failed("ucp_mem_map", s);
        }
        void* key = nullptr;
        std::size_t key_bytes = 0;
        if (ucs_status_t s = ucp_rkey_pack(peer.context(), mapped.memory_, &key, &key_bytes); s != UCS_OK) {
            return failed("ucp_rkey_pack", s);
        }
        const auto* begin = static_cast<const std::byte*>(key);
        mapped.key_.assign(begin, begin + key_bytes);
        ucp_rkey_buffer_release(key);
        return mapped;
    }

    MappedMemory(MappedMemory&& other) noexcept
        : context_(std::exchange(other.context_, nullptr)),
          memory_(std::exchange(other.memory_, nullptr)),
          key_(std::move(other.key_)) {}
    MappedMemory& operator=(MappedMemory&&) = delete;
    MappedMemory(const MappedMemory&) = delete;
    MappedMemory& operator=(const MappedMemory&) = delete;
    ~MappedMemory() {
        if (memory_ != nullptr) (void)ucp_mem_unmap(context_, memory_);
    }

    /// The packed remote key a peer unpacks to write this memory.
    std::span<const std::byte> key() const noexcept { return key_; }

private:
    MappedMemory() = default;
    ucp_context_h context_ = nullptr;
    ucp_mem_h memory_ = nullptr;
    std::vector<std::byte> key_;
};

/// An endpoint to a peer's worker, with the remote keys of the peer's memory it writes.
class Endpoint {
public:
    static Result<Endpoint> connect(const Peer& peer, std::span<const std::byte> address) {
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = reinterpret_cast<const ucp_address_t*>(address.data());
        Endpoint endpoint;
        endpoint.worker_ = peer.worker();
        if (ucs_status_t s = ucp_ep_create(peer.worker(), &params, &endpoint.ep_); s != UCS_OK) {
            return failed("ucp_ep_create", s);
        }
        return endpoint;
    }

    Endpoint(Endpoint&& other) noexcept
        : worker_(std::exchange(other.worker_, nullptr)),
          ep_(std::exchange(other.ep_, nullptr)),
          keys_(std::move(other.keys_)) {}
    Endpoint& operator=(Endpoint&&) = delete;
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;
    ~Endpoint() {
        for (ucp_rkey_h key : keys_) {
            if (key != nullptr) ucp_rkey_destroy(key);
        }
        if (ep_ != nullptr) {
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            (void)wait_for(worker_, ucp_ep_close_nbx(ep_, &param), "ucp_ep_close_nbx");
        }
    }

    /// Unpacks a remote key the peer packed; returns its index for put().
    Result<std::size_t> add_key(std::span<const std::byte> packed) {
        ucp_rkey_h key = nullptr;
        if (ucs_status_t s = ucp_ep_rkey_unpack(ep_, packed.data(), &key); s != UCS_OK) {
            return failed("ucp_ep_rkey_unpack", s);
        }
        keys_.push_back(key);
        return keys_.size() - 1;
    }

    /// Writes `bytes` from `source` to the peer's `remote` address in the memory of key `key`;
    /// returns once `source` may be reused (flush() for the peer to see it).
    Status put(const void* source, std::size_t bytes, std::uint64_t remote, std::size_t key) {
        ucp_request_param_t param{};
        return wait_for(worker_, ucp_put_nbx(ep_, source, bytes, remote, keys_[key], &param), "ucp_put_nbx");
    }

    /// Returns once every put so far is complete at the peer.
    Status flush() {
        ucp_request_param_t param{};
        return wait_for(worker_, ucp_ep_flush_nbx(ep_, &param), "ucp_ep_flush_nbx");
    }

private:
    Endpoint() = default;
    ucp_worker_h worker_ = nullptr;
    ucp_ep_h ep_ = nullptr;
    std::vector<ucp_rkey_h> keys_;
};

}  // namespace ucx
