// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private: CudaBackend's existing host memory pinned in place — cudaHostRegister with
// cudaHostRegisterPortable (pinned for every device, as the backend's pinned_malloc memory is:
// cudaHostAllocPortable) and cudaHostUnregister, resolved where the runtime exports them; and
// how their failures map: memory registered already (or overlapping a registered range) is
// invalid_argument, a pointer never registered is unknown_pointer, as the simulator and the
// mock report them. And where the device sits: its nearest host NUMA node
// (cudaDevAttrHostNumaId) and its PCI address (cudaDeviceGetPCIBusId), for NUMA placement; and
// cudaDeviceReset, for CudaBackend::reset_device (after pinned memory went back).

#include <cstddef>
#include <string>

#include "devstage/backends/cuda_abi.hpp"
#include "devstage/backends/detail/dynamic_library.hpp"
#include "devstage/backends/detail/runtime_call.hpp"
#include "devstage/detail/util/message.hpp"
#include "devstage/status.hpp"

namespace devstage {
namespace cudart {
inline constexpr unsigned host_register_portable = 0x01;
inline constexpr cudaError_t error_invalid_value = 1;
inline constexpr cudaError_t error_host_memory_already_registered = 712;
inline constexpr cudaError_t error_host_memory_not_registered = 713;
}  // namespace cudart

namespace detail {

struct CudaHostRegisterApi {
    cudart::cudaError_t (*host_register)(void*, std::size_t, unsigned) = nullptr;
    cudart::cudaError_t (*host_unregister)(void*) = nullptr;
    cudart::cudaError_t (*device_get_attribute)(int*, int, int) = nullptr;
    cudart::cudaError_t (*get_pci_bus_id)(char*, int, int) = nullptr;
    cudart::cudaError_t (*device_reset)() = nullptr;

    /// Both registration entry points, or neither (then every call is not_supported); the two
    /// device queries and the reset each where exported.
    void resolve(const DynamicLibrary& library) noexcept {
        CudaHostRegisterApi found;
        if (library.resolve("cudaHostRegister", found.host_register).ok() &&
            library.resolve("cudaHostUnregister", found.host_unregister).ok()) {
            *this = found;
        }
        if (!library.resolve("cudaDeviceGetAttribute", device_get_attribute).ok()) device_get_attribute = nullptr;
        if (!library.resolve("cudaDeviceGetPCIBusId", get_pci_bus_id).ok()) get_pci_bus_id = nullptr;
        if (!library.resolve("cudaDeviceReset", device_reset).ok()) device_reset = nullptr;
    }

    /// cudaDeviceGetAttribute(cudaDevAttrHostNumaId): -1 where the system has no NUMA.
    Result<int> host_numa_node(const CudaRuntimeErrors& errors, const CallSite& site, int device) const noexcept {
        if (device_get_attribute == nullptr) return missing("cudaDeviceGetAttribute");
        int node = -1;
        if (Status s = checked_call(errors, site, "cudaDeviceGetAttribute(cudaDevAttrHostNumaId)", 0,
                                    device_get_attribute, &node, cudart::device_attribute_host_numa_id, device);
            !s) {
            return s;
        }
        return node < 0 ? -1 : node;
    }

    /// cudaDeviceGetPCIBusId: "domain:bus:device.function", in hexadecimal.
    Result<std::string> pci_bus_id(const CudaRuntimeErrors& errors, const CallSite& site, int device) const noexcept {
        if (get_pci_bus_id == nullptr) return missing("cudaDeviceGetPCIBusId");
        char id[16] = {};  // pci_bus_id_length (13) and room for a longer domain
        if (Status s = checked_call(errors, site, "cudaDeviceGetPCIBusId", 0, get_pci_bus_id, id,
                                    static_cast<int>(sizeof id - 1), device);
            !s) {
            return s;
        }
        return std::string(id);  // at most 15 characters: no allocation
    }

    /// cudaHostRegister(host, bytes, cudaHostRegisterPortable); the caller made its device current.
    Status register_range(const CudaRuntimeErrors& errors, const CallSite& site, void* host,
                          std::size_t bytes) const noexcept {
        if (host == nullptr || bytes == 0) {
            return Status(Errc::invalid_argument, message(site.backend, " cudaHostRegister of ", bytes, " bytes at ",
                                                          static_cast<const void*>(host), ": nothing to pin"));
        }
        if (host_register == nullptr) return missing("cudaHostRegister");
        const cudart::cudaError_t code = host_register(host, bytes, cudart::host_register_portable);
        if (code == cudart::success) return {};
        Status failed = call_failure(errors, site, "cudaHostRegister", code, bytes);
        if (code == cudart::error_host_memory_already_registered || code == cudart::error_invalid_value) {
            return Status(Errc::invalid_argument,
                          message(failed.message(), " (", static_cast<const void*>(host),
                                  code == cudart::error_invalid_value ? ": not a range CUDA can pin"
                                                                      : ": registered already, or overlapping a "
                                                                        "registered range",
                                  ")"));
        }
        return failed;
    }

    /// cudaHostUnregister(host); the caller made its device current.
    Status unregister(const CudaRuntimeErrors& errors, const CallSite& site, void* host) const noexcept {
        if (host_unregister == nullptr) return missing("cudaHostUnregister");
        const cudart::cudaError_t code = host_unregister(host);
        if (code == cudart::success) return {};
        Status failed = call_failure(errors, site, "cudaHostUnregister", code, 0);
        if (code != cudart::error_host_memory_not_registered) return failed;
        return Status(Errc::unknown_pointer, message(failed.message(), " (", static_cast<const void*>(host),
                                                     " was never registered, or was unregistered already)"));
    }

private:
    static Status missing(const char* call) noexcept {
        return Status(Errc::not_supported, message("cuda: the runtime loaded has no ", call));
    }
};

}  // namespace detail
}  // namespace devstage
