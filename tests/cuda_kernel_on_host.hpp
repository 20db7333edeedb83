// SPDX-License-Identifier: Apache-2.0
#pragma once
// CudaKernelOnHost: CudaBackend without its host functions, for the async staging suite. Its
// stand-in kernel copies through CUDA, which a host function must not do (cudaLaunchHostFunc;
// the test stand-in refuses it, as CUDA may): over this type the suite waits for the stream
// and runs the kernel on the host.
#include <utility>

#include "devstage/backends/cuda.hpp"

namespace devstage::test {
class CudaKernelOnHost : private CudaBackend {
public:
    explicit CudaKernelOnHost(CudaBackend&& gpu) noexcept : CudaBackend(std::move(gpu)) {}
    using CudaBackend::copy_from_device;
    using CudaBackend::copy_from_device_async;
    using CudaBackend::copy_to_device;
    using CudaBackend::copy_to_device_async;
    using CudaBackend::create_event;
    using CudaBackend::create_stream;
    using CudaBackend::destroy_event;
    using CudaBackend::destroy_stream;
    using CudaBackend::device_alignment;
    using CudaBackend::device_free;
    using CudaBackend::device_malloc;
    using CudaBackend::Event;
    using CudaBackend::event_ready;
    using CudaBackend::name;
    using CudaBackend::pinned_free;
    using CudaBackend::pinned_malloc;
    using CudaBackend::record_event;
    using CudaBackend::Stream;
    using CudaBackend::stream_wait_event;
    using CudaBackend::synchronize_event;
};
static_assert(AsyncBackend<CudaKernelOnHost> && PinnedHostBackend<CudaKernelOnHost>);
static_assert(!HostFunctionBackend<CudaKernelOnHost>);
}  // namespace devstage::test
