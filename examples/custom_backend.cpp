// SPDX-License-Identifier: Apache-2.0
// A user-defined backend: a wrapper over SimBackend that counts bytes per direction and
// refuses allocations above a per-call limit. Any type modelling devstage::Backend works.
#include <cstdio>
#include <string_view>
#include <vector>

#include "devstage/backends/sim.hpp"
#include "devstage/devstage.hpp"

class CountingBackend {
public:
    static constexpr std::size_t device_alignment = devstage::SimBackend::device_alignment;

    CountingBackend(devstage::SimBackend& inner, std::size_t max_allocation) : inner_(&inner), max_(max_allocation) {}

    std::string_view name() const noexcept { return "counting-sim"; }
    devstage::Result<void*> device_malloc(std::size_t n) noexcept {
        if (n > max_) return devstage::Status(devstage::Errc::out_of_memory, "counting-sim: allocation over the limit");
        ++mallocs;
        return inner_->device_malloc(n);
    }
    devstage::Status device_free(void* p) noexcept { return inner_->device_free(p); }
    devstage::Status copy_to_device(void* dst, const void* src, std::size_t n) noexcept {
        uploaded += n;
        return inner_->copy_to_device(dst, src, n);
    }
    devstage::Status copy_from_device(void* dst, const void* src, std::size_t n) noexcept {
        downloaded += n;
        return inner_->copy_from_device(dst, src, n);
    }

    std::size_t mallocs = 0, uploaded = 0, downloaded = 0;

private:
    devstage::SimBackend* inner_;
    std::size_t max_;
};

static_assert(devstage::Backend<CountingBackend>);
static_assert(!devstage::PinnedHostBackend<CountingBackend>);

int main() {
    devstage::SimBackend sim;
    CountingBackend backend(sim, std::size_t{1} << 30);
    devstage::Stager<CountingBackend> stager(backend);  // RetainedBump<> over our own backend

    std::vector<float> input(1 << 16, 1.0f), output(1 << 10);
    const devstage::TensorArg args[] = {
        {input.data(), input.size() * sizeof(float), devstage::Direction::In},
        {output.data(), output.size() * sizeof(float), devstage::Direction::Out},
    };
    for (int step = 0; step < 5; ++step) {
        auto run = stager.bind(args);
        if (!run) return std::fprintf(stderr, "%s\n", run.status().message().c_str()), 1;
        if (auto s = stager.finish(std::move(*run)); !s) return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    }
    std::printf("backend '%.*s': %zu device allocation(s) for 5 runs, %zu bytes up, %zu bytes down\n",
                static_cast<int>(backend.name().size()), backend.name().data(), backend.mallocs, backend.uploaded,
                backend.downloaded);
    return 0;
}
