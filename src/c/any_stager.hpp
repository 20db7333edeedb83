// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: a Stager over AnyBackend behind one interface, whatever its strategy.
// C cannot instantiate templates, so the library is built with one stager per strategy kind —
// PerTensorMalloc, RetainedBump with a growth rule chosen at run time, RetainedVmm — all at
// 1024-byte alignment; packing, mapping, slots and outputs are run-time options (StagerOptions).

#include <cstddef>
#include <memory>
#include <span>

#include "any_backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/completion.hpp"
#include "devstage/frame.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/run.hpp"
#include "devstage/stager_options.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/strategy/retained_vmm.hpp"
#include "devstage/tensor.hpp"

namespace devstage::capi {

/// Stager::max_pipeline_slots, checked where the stagers are made (stager_of.hpp).
inline constexpr std::size_t max_pipeline_slots = 256;
inline constexpr std::size_t slice_alignment = 1024;
using PerTensor = PerTensorMalloc<slice_alignment>;
using Retained = RetainedBump<GrowthRule, slice_alignment, NoPacking>;
using Vmm = RetainedVmm<slice_alignment>;

/// The operations of Stager<AnyBackend, S> the C interface offers. Frames need a packing
/// stager (pack limit above 0) and reserve() a retained one: elsewhere they are not_supported.
class AnyStager {
public:
    using Stream = AnyBackend::Stream;

    AnyStager() = default;
    AnyStager(const AnyStager&) = delete;
    AnyStager& operator=(const AnyStager&) = delete;
    virtual ~AnyStager() = default;

    virtual Result<StagedRun> bind(std::span<const TensorArg> args) noexcept = 0;
    virtual Result<StagedRun> bind(std::span<const TensorArg> args, Stream stream) noexcept = 0;
    virtual Result<StagedRun> bind(const HostFrame& frame) noexcept = 0;
    virtual Result<StagedRun> bind(const HostFrame& frame, Stream stream) noexcept = 0;
    virtual Status finish(StagedRun&& run, const Status& execution) noexcept = 0;
    virtual Result<Completion> finish(StagedRun&& run, Stream stream, const Status& execution) noexcept = 0;
    virtual Status order_after_uploads(const StagedRun& run, Stream stream) noexcept = 0;
    virtual Result<HostFrame> frame(std::span<const TensorShape> shapes) noexcept = 0;
    virtual Status reserve(std::size_t bytes) noexcept = 0;
    virtual Status release() noexcept = 0;
    virtual void abandon() noexcept = 0;
    virtual const StagerStats& stats() const noexcept = 0;
    /// Ok, or why the stager has no slot.
    virtual const Status& status() const noexcept = 0;
    virtual void set_error_sink(ErrorSink sink) noexcept = 0;
    virtual void set_output_policy(OutputPolicy policy) noexcept = 0;
};

/// A stager of `strategy` over `backend` (which outlives it), configured by `options`. Throws
/// std::bad_alloc when host memory runs out. Defined, for each strategy kind, in a file of its
/// own (stager_*.cpp).
template <class Strategy>
std::unique_ptr<AnyStager> make_stager_of(AnyBackend& backend, Strategy strategy, const StagerOptions& options);

extern template std::unique_ptr<AnyStager> make_stager_of<PerTensor>(AnyBackend&, PerTensor, const StagerOptions&);
extern template std::unique_ptr<AnyStager> make_stager_of<Retained>(AnyBackend&, Retained, const StagerOptions&);
extern template std::unique_ptr<AnyStager> make_stager_of<Vmm>(AnyBackend&, Vmm, const StagerOptions&);

/// The stager `config` describes (null: the defaults), or invalid_argument / not_supported
/// naming the field at fault. Throws std::bad_alloc when host memory runs out.
Result<std::unique_ptr<AnyStager>> make_stager(AnyBackend& backend, const devstage_stager_config* config);

}  // namespace devstage::capi
