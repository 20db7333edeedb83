// SPDX-License-Identifier: Apache-2.0
#pragma once
// Private to devstage_c: a Stager over AnyBackend behind one interface, whatever its strategy.
// C cannot instantiate templates, so the library is built with a fixed set of strategies:
// PerTensorMalloc, and RetainedBump without packing or with one of the DEVSTAGE_PACK_LIMIT_*
// limits, all at 1024-byte alignment and with a growth policy chosen at run time.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "any_backend.hpp"
#include "devstage/c/devstage.h"
#include "devstage/completion.hpp"
#include "devstage/frame.hpp"
#include "devstage/output_policy.hpp"
#include "devstage/run.hpp"
#include "devstage/stats.hpp"
#include "devstage/status.hpp"
#include "devstage/strategy/growth.hpp"
#include "devstage/strategy/packing.hpp"
#include "devstage/strategy/per_tensor.hpp"
#include "devstage/strategy/retained_bump.hpp"
#include "devstage/tensor.hpp"

namespace devstage::capi {

/// A growth policy chosen at run time: exact, geometric (a factor num/den above 1) or granular
/// (a power-of-two granule). The C stagers wrap it in CappedGrowth (no cap: the largest size).
class RuntimeGrowth {
public:
    enum class Kind : std::uint8_t { exact, geometric, granular };

    RuntimeGrowth() noexcept = default;
    RuntimeGrowth(Kind kind, std::uint32_t numerator, std::uint32_t denominator, std::size_t granule) noexcept
        : kind_(kind), numerator_(numerator), denominator_(denominator), granule_(granule) {}

    Result<std::size_t> next_capacity(std::size_t current, std::size_t required) const noexcept;

private:
    Kind kind_ = Kind::exact;
    std::uint32_t numerator_ = 1, denominator_ = 1;
    std::size_t granule_ = 1;
};
static_assert(GrowthPolicy<RuntimeGrowth>);

using Growth = CappedGrowth<RuntimeGrowth>;
/// Stager::max_pipeline_slots, checked where the stagers are made (stager_of.hpp).
inline constexpr std::size_t max_pipeline_slots = 256;
inline constexpr std::size_t slice_alignment = 1024;
using PerTensor = PerTensorMalloc<slice_alignment>;
using Retained = RetainedBump<Growth, slice_alignment, NoPacking>;
template <std::size_t Limit>
using Packed = RetainedBump<Growth, slice_alignment, PackSmall<Limit>>;

/// The operations of Stager<AnyBackend, S> the C interface offers. Frames need a packing
/// strategy and reserve() a retained one: elsewhere they are not_supported.
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

/// A stager of `strategy` over `backend` (which outlives it). Throws std::bad_alloc when host
/// memory runs out. Defined, for each strategy of the fixed set, in a file of its own.
template <class Strategy>
std::unique_ptr<AnyStager> make_stager_of(AnyBackend& backend, Strategy strategy, std::size_t slots);

extern template std::unique_ptr<AnyStager> make_stager_of<PerTensor>(AnyBackend&, PerTensor, std::size_t);
extern template std::unique_ptr<AnyStager> make_stager_of<Retained>(AnyBackend&, Retained, std::size_t);
extern template std::unique_ptr<AnyStager> make_stager_of<Packed<DEVSTAGE_PACK_LIMIT_4K>>(
    AnyBackend&, Packed<DEVSTAGE_PACK_LIMIT_4K>, std::size_t);
extern template std::unique_ptr<AnyStager> make_stager_of<Packed<DEVSTAGE_PACK_LIMIT_16K>>(
    AnyBackend&, Packed<DEVSTAGE_PACK_LIMIT_16K>, std::size_t);
extern template std::unique_ptr<AnyStager> make_stager_of<Packed<DEVSTAGE_PACK_LIMIT_64K>>(
    AnyBackend&, Packed<DEVSTAGE_PACK_LIMIT_64K>, std::size_t);

/// The stager `config` describes (null: the defaults), or invalid_argument / not_supported
/// naming the field at fault. Throws std::bad_alloc when host memory runs out.
Result<std::unique_ptr<AnyStager>> make_stager(AnyBackend& backend, const devstage_stager_config* config);

}  // namespace devstage::capi
