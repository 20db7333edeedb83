// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: make_stager_of's definition, included by the one file that builds the
// stagers of each strategy (each instantiation compiles on its own).

#include <cstddef>
#include <memory>
#include <span>
#include <utility>

#include "any_backend.hpp"
#include "any_stager.hpp"
#include "devstage/stager.hpp"

namespace devstage::capi {

template <class Strategy>
class StagerOf final : public AnyStager {
    static_assert(Stager<AnyBackend, Strategy>::max_pipeline_slots == max_pipeline_slots);
    static constexpr bool mirrored = MirroredStrategy<Strategy, AnyBackend>;
    static constexpr bool retained = Strategy::lease_kind == ReleaseKind::BufferNoop;

public:
    StagerOf(AnyBackend& backend, Strategy strategy, const StagerOptions& options) noexcept
        : stager_(backend, std::move(strategy), options) {}

    Result<StagedRun> bind(std::span<const TensorArg> args) noexcept override { return stager_.bind(args); }
    Result<StagedRun> bind(std::span<const TensorArg> args, Stream stream) noexcept override {
        return stager_.bind(args, stream);
    }
    Result<StagedRun> bind(const HostFrame& frame) noexcept override { return stager_.bind(frame); }
    Result<StagedRun> bind(const HostFrame& frame, Stream stream) noexcept override {
        return stager_.bind(frame, stream);
    }
    Status finish(StagedRun&& run, const Status& execution) noexcept override {
        return stager_.finish(std::move(run), execution);
    }
    Result<Completion> finish(StagedRun&& run, Stream stream, const Status& execution) noexcept override {
        return stager_.finish(std::move(run), stream, execution);
    }
    Status order_after_uploads(const StagedRun& run, Stream stream) noexcept override {
        return stager_.order_after_uploads(run, stream);
    }
    Result<HostFrame> frame(std::span<const TensorShape> shapes) noexcept override {
        if constexpr (mirrored) {
            if (stager_.pack_limit() > 0) return stager_.frame(shapes);
        }
        return Status(Errc::not_supported,
                      detail::message("stager frame: frames need a packing stager (pack_limit > 0); this stager "
                                      "on backend '",
                                      stager_.backend().name(), "' has pack_limit 0"));
    }
    Status reserve(std::size_t bytes) noexcept override {
        if constexpr (retained) {
            return stager_.reserve(bytes);
        } else {
            return Status(Errc::not_supported,
                          detail::message("stager reserve: ", bytes,
                                          " bytes asked for, but the per-tensor strategy retains nothing (backend '",
                                          stager_.backend().name(), "')"));
        }
    }
    Status release() noexcept override { return stager_.release(); }
    void abandon() noexcept override { stager_.abandon(); }
    const StagerStats& stats() const noexcept override { return stager_.stats(); }
    const Status& status() const noexcept override { return stager_.status(); }
    void set_error_sink(ErrorSink sink) noexcept override { stager_.set_error_sink(sink); }
    void set_output_policy(OutputPolicy policy) noexcept override { stager_.set_output_policy(policy); }

private:
    Stager<AnyBackend, Strategy> stager_;
};

template <class Strategy>
std::unique_ptr<AnyStager> make_stager_of(AnyBackend& backend, Strategy strategy, const StagerOptions& options) {
    return std::make_unique<StagerOf<Strategy>>(backend, std::move(strategy), options);
}

}  // namespace devstage::capi
