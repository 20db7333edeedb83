// SPDX-License-Identifier: Apache-2.0
#pragma once
// The contract every AsyncBackend must pass, written once against the concept. Use it for
// your own backend:
//
//   using AsyncBackends = std::tuple<MyBackend>;
//   #include "async_contract.hpp"
//
// (and specialize devstage::test::BackendFactory<MyBackend> if it is not default-constructible).
// The cases that hold a stream inside a host function run when the backend is also a
// HostFunctionBackend. A runtime that cannot tell a destroyed handle from a live one skips
// the "[stale-handle]" case (run the tests with `~[stale-handle]`).

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "async_support.hpp"
#include "devstage/backend.hpp"
#include "support.hpp"
TEMPLATE_LIST_TEST_CASE("async contract: static facts", "[async][contract]", AsyncBackends) {
    STATIC_REQUIRE(devstage::AsyncBackend<TestType>);
    STATIC_REQUIRE_FALSE(std::is_same_v<typename TestType::Stream, typename TestType::Event>);
    STATIC_REQUIRE(std::is_trivially_copyable_v<typename TestType::Stream>);
    STATIC_REQUIRE(std::is_trivially_copyable_v<typename TestType::Event>);
    auto backend = devstage::test::make_backend<TestType>();
    const auto first = devstage::test::make_stream(*backend);
    const auto second = devstage::test::make_stream(*backend);
    CHECK(first == first);
    CHECK_FALSE(first == second);
    CHECK(backend->destroy_stream(first).ok());
    CHECK(backend->destroy_stream(second).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: work on one stream runs in order", "[async][contract]", AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    constexpr std::size_t bytes = (std::size_t{1} << 20) + 3;
    for (const bool pinned : devstage::test::host_kinds<TestType>()) {
        CAPTURE(pinned);
        const auto stream = devstage::test::make_stream(*backend);
        const auto event = devstage::test::make_event(*backend);
        {
            devstage::test::DeviceBytes device(*backend, bytes);
            devstage::test::HostBytes first(*backend, bytes, pinned);
            devstage::test::HostBytes second(*backend, bytes, pinned);
            devstage::test::HostBytes out_first(*backend, bytes, pinned);
            devstage::test::HostBytes out_second(*backend, bytes, pinned);
            first.fill(devstage::test::pattern(bytes, 1));
            second.fill(devstage::test::pattern(bytes, 2));
            // The same device bytes written, read, overwritten and read again: only stream order
            // gives each read the bytes written just before it.
            REQUIRE(backend->copy_to_device_async(device.get(), first.get(), bytes, stream).ok());
            REQUIRE(backend->copy_from_device_async(out_first.get(), device.get(), bytes, stream).ok());
            REQUIRE(backend->copy_to_device_async(device.get(), second.get(), bytes, stream).ok());
            REQUIRE(backend->copy_from_device_async(out_second.get(), device.get(), bytes, stream).ok());
            REQUIRE(backend->record_event(event, stream).ok());
            REQUIRE(backend->synchronize_event(event).ok());
            CHECK(devstage::test::same_bytes(out_first.bytes(), devstage::test::pattern(bytes, 1)));
            CHECK(devstage::test::same_bytes(out_second.bytes(), devstage::test::pattern(bytes, 2)));
            const devstage::Result<bool> ready = backend->event_ready(event);
            REQUIRE(ready.ok());
            CHECK(*ready);
        }
        CHECK(backend->destroy_event(event).ok());
        CHECK(backend->destroy_stream(stream).ok());
    }
}

TEMPLATE_LIST_TEST_CASE("async contract: a stream that waits for an event sees the work before it", "[async][contract]",
                        AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    constexpr std::size_t bytes = 300000;
    for (const bool pinned : devstage::test::host_kinds<TestType>()) {
        CAPTURE(pinned);
        const auto producer = devstage::test::make_stream(*backend);
        const auto consumer = devstage::test::make_stream(*backend);
        const auto produced = devstage::test::make_event(*backend);
        const auto consumed = devstage::test::make_event(*backend);
        {
            devstage::test::DeviceBytes device(*backend, bytes);
            devstage::test::HostBytes in(*backend, bytes, pinned);
            devstage::test::HostBytes out(*backend, bytes, pinned);
            in.fill(devstage::test::pattern(bytes, 3));
            // With pinned memory the producer is held before its copy, so a consumer that did not
            // wait would read the device bytes before they were written. (A copy of pageable
            // memory may block the host until it ran, which would need the gate open.)
            devstage::test::StreamGate gate;
            const bool hold = pinned && devstage::HostFunctionBackend<TestType>;
            if constexpr (devstage::HostFunctionBackend<TestType>) {
                if (hold) REQUIRE(backend->launch_host_func(producer, &devstage::test::StreamGate::hold, &gate).ok());
            }
            REQUIRE(backend->copy_to_device_async(device.get(), in.get(), bytes, producer).ok());
            REQUIRE(backend->record_event(produced, producer).ok());
            REQUIRE(backend->stream_wait_event(consumer, produced).ok());
            REQUIRE(backend->copy_from_device_async(out.get(), device.get(), bytes, consumer).ok());
            REQUIRE(backend->record_event(consumed, consumer).ok());
            if (hold) {
                const devstage::Result<bool> ready = backend->event_ready(consumed);
                REQUIRE(ready.ok());
                if (!gate.ran_inline()) CHECK_FALSE(*ready);
                gate.open();
            }
            REQUIRE(backend->synchronize_event(consumed).ok());
            CHECK(devstage::test::same_bytes(out.bytes(), devstage::test::pattern(bytes, 3)));
            REQUIRE(backend->synchronize_event(produced).ok());
        }
        for (const auto event : {produced, consumed}) CHECK(backend->destroy_event(event).ok());
        for (const auto stream : {producer, consumer}) CHECK(backend->destroy_stream(stream).ok());
    }
}

TEMPLATE_LIST_TEST_CASE("async contract: an event never recorded is ready", "[async][contract]", AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    const auto stream = devstage::test::make_stream(*backend);
    const auto never = devstage::test::make_event(*backend);
    const auto after = devstage::test::make_event(*backend);
    const devstage::Result<bool> ready = backend->event_ready(never);
    REQUIRE(ready.ok());
    CHECK(*ready);
    CHECK(backend->synchronize_event(never).ok());
    // A stream told to wait for it does not wait.
    CHECK(backend->stream_wait_event(stream, never).ok());
    REQUIRE(backend->record_event(after, stream).ok());
    CHECK(backend->synchronize_event(after).ok());
    for (const auto event : {never, after}) CHECK(backend->destroy_event(event).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: event_ready never blocks", "[async][contract]", AsyncBackends) {
    if constexpr (devstage::HostFunctionBackend<TestType>) {
        auto backend = devstage::test::make_backend<TestType>();
        const auto stream = devstage::test::make_stream(*backend);
        const auto event = devstage::test::make_event(*backend);
        devstage::test::StreamGate gate;
        REQUIRE(backend->launch_host_func(stream, &devstage::test::StreamGate::hold, &gate).ok());
        REQUIRE(backend->record_event(event, stream).ok());
        // While the stream is held, the query answers "not ready" and returns (a blocking query
        // would never return: the gate opens only below).
        for (int i = 0; i < 3; ++i) {
            const devstage::Result<bool> ready = backend->event_ready(event);
            REQUIRE(ready.ok());
            if (!gate.ran_inline()) CHECK_FALSE(*ready);
        }
        gate.open();
        REQUIRE(backend->synchronize_event(event).ok());
        const devstage::Result<bool> ready = backend->event_ready(event);
        REQUIRE(ready.ok());
        CHECK(*ready);
        CHECK(gate.runs() == 1);
        CHECK(backend->destroy_event(event).ok());
        CHECK(backend->destroy_stream(stream).ok());
    } else {
        SUCCEED("no host functions: nothing can hold a stream");
    }
}

TEMPLATE_LIST_TEST_CASE("async contract: synchronize_event returns once the work completed", "[async][contract]",
                        AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    constexpr std::size_t bytes = 1 << 20;
    const bool pinned = devstage::test::host_kinds<TestType>().back();
    const auto stream = devstage::test::make_stream(*backend);
    const auto event = devstage::test::make_event(*backend);
    {
        devstage::test::DeviceBytes device(*backend, bytes);
        devstage::test::HostBytes in(*backend, bytes, pinned);
        devstage::test::HostBytes out(*backend, bytes, pinned);
        in.fill(devstage::test::pattern(bytes, 4));
        std::atomic<bool> flag{false};
        REQUIRE(backend->copy_to_device_async(device.get(), in.get(), bytes, stream).ok());
        if constexpr (devstage::HostFunctionBackend<TestType>) {
            REQUIRE(backend->launch_host_func(stream, &devstage::test::set_flag_slowly, &flag).ok());
        }
        REQUIRE(backend->copy_from_device_async(out.get(), device.get(), bytes, stream).ok());
        REQUIRE(backend->record_event(event, stream).ok());
        REQUIRE(backend->synchronize_event(event).ok());
        if constexpr (devstage::HostFunctionBackend<TestType>) CHECK(flag.load());
        CHECK(devstage::test::same_bytes(out.bytes(), devstage::test::pattern(bytes, 4)));
    }
    CHECK(backend->destroy_event(event).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: a wait keeps the recording it saw, not a later one", "[async][contract]",
                        AsyncBackends) {
    if constexpr (devstage::HostFunctionBackend<TestType>) {
        auto backend = devstage::test::make_backend<TestType>();
        constexpr std::size_t bytes = 4096;
        const bool pinned = devstage::test::host_kinds<TestType>().back();
        const auto producer = devstage::test::make_stream(*backend);
        const auto consumer = devstage::test::make_stream(*backend);
        const auto produced = devstage::test::make_event(*backend);
        const auto consumed = devstage::test::make_event(*backend);
        {
            devstage::test::DeviceBytes device(*backend, bytes);
            devstage::test::HostBytes in(*backend, bytes, pinned);
            devstage::test::HostBytes out(*backend, bytes, pinned);
            in.fill(devstage::test::pattern(bytes, 5));
            REQUIRE(backend->copy_to_device_async(device.get(), in.get(), bytes, producer).ok());
            REQUIRE(backend->record_event(produced, producer).ok());
            REQUIRE(backend->stream_wait_event(consumer, produced).ok());
            // Re-recorded behind a held host function: the consumer must not wait for this one
            // (if it did, synchronize_event(consumed) would never return: the gate opens after).
            devstage::test::StreamGate gate;
            REQUIRE(backend->launch_host_func(producer, &devstage::test::StreamGate::hold, &gate).ok());
            REQUIRE(backend->record_event(produced, producer).ok());
            REQUIRE(backend->copy_from_device_async(out.get(), device.get(), bytes, consumer).ok());
            REQUIRE(backend->record_event(consumed, consumer).ok());
            REQUIRE(backend->synchronize_event(consumed).ok());
            CHECK(devstage::test::same_bytes(out.bytes(), devstage::test::pattern(bytes, 5)));
            if (!gate.ran_inline()) {
                const devstage::Result<bool> ready = backend->event_ready(produced);
                REQUIRE(ready.ok());
                CHECK_FALSE(*ready);
            }
            gate.open();
            REQUIRE(backend->synchronize_event(produced).ok());
            CHECK(gate.runs() == 1);
        }
        for (const auto event : {produced, consumed}) CHECK(backend->destroy_event(event).ok());
        for (const auto stream : {producer, consumer}) CHECK(backend->destroy_stream(stream).ok());
    } else {
        SUCCEED("no host functions: nothing can hold a stream");
    }
}

TEMPLATE_LIST_TEST_CASE("async contract: a bad copy fails at the enqueuing call", "[async][contract][errors]",
                        AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    const auto stream = devstage::test::make_stream(*backend);
    const auto event = devstage::test::make_event(*backend);
    {
        devstage::test::DeviceBytes device(*backend, 1000);
        std::vector<std::byte> host(2000);
        const devstage::Status beyond = backend->copy_to_device_async(device.get(), host.data(), 1001, stream);
        CHECK_FALSE(beyond.ok());
        CHECK_FALSE(beyond.message().empty());
        CHECK_FALSE(backend->copy_from_device_async(host.data(), device.get() + 500, 501, stream).ok());
        CHECK_FALSE(backend->copy_to_device_async(host.data(), host.data() + 1000, 10, stream).ok());
        CHECK_FALSE(backend->copy_to_device_async(device.get(), nullptr, 10, stream).ok());
        CHECK_FALSE(backend->copy_from_device_async(nullptr, device.get(), 10, stream).ok());
        // The stream is still usable, and the failed calls left nothing behind to report later.
        const auto in = devstage::test::pattern(1000, 6);
        std::vector<std::byte> out(1000);
        REQUIRE(backend->copy_to_device_async(device.get(), in.data(), 1000, stream).ok());
        REQUIRE(backend->copy_from_device_async(out.data(), device.get(), 1000, stream).ok());
        REQUIRE(backend->record_event(event, stream).ok());
        REQUIRE(backend->synchronize_event(event).ok());
        CHECK(devstage::test::same_bytes(out, in));
    }
    CHECK(backend->destroy_event(event).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: a destroyed stream or event is unknown", "[async][contract][stale-handle]",
                        AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    const auto stream = devstage::test::make_stream(*backend);
    const auto event = devstage::test::make_event(*backend);
    REQUIRE(backend->destroy_stream(stream).ok());
    REQUIRE(backend->destroy_event(event).ok());
    const devstage::Status stream_again = backend->destroy_stream(stream);
    CHECK_FALSE(stream_again.ok());
    CHECK_FALSE(stream_again.message().empty());
    CHECK_FALSE(backend->destroy_event(event).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: zero-byte async copies are no-ops", "[async][contract]", AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    const auto stream = devstage::test::make_stream(*backend);
    const auto event = devstage::test::make_event(*backend);
    {
        devstage::test::DeviceBytes device(*backend, 64);
        const auto before = devstage::test::pattern(64, 7);
        REQUIRE(backend->copy_to_device(device.get(), before.data(), 64).ok());
        std::vector<std::byte> host(64, std::byte{0x11});
        CHECK(backend->copy_to_device_async(device.get(), host.data(), 0, stream).ok());
        CHECK(backend->copy_from_device_async(host.data(), device.get(), 0, stream).ok());
        REQUIRE(backend->record_event(event, stream).ok());
        REQUIRE(backend->synchronize_event(event).ok());
        CHECK(devstage::test::same_bytes(devstage::test::read_device(*backend, device.get(), 64), before));
        CHECK(std::all_of(host.begin(), host.end(), [](std::byte b) { return b == std::byte{0x11}; }));
    }
    CHECK(backend->destroy_event(event).ok());
    CHECK(backend->destroy_stream(stream).ok());
}

TEMPLATE_LIST_TEST_CASE("async contract: many streams and events come and go", "[async][contract]", AsyncBackends) {
    auto backend = devstage::test::make_backend<TestType>();
    constexpr std::size_t stream_count = 8;
    constexpr std::size_t event_count = 32;
    constexpr std::size_t slice = 256;
    for (int round = 0; round < 3; ++round) {
        std::vector<typename TestType::Stream> streams;
        std::vector<typename TestType::Event> events;
        for (std::size_t i = 0; i < stream_count; ++i) streams.push_back(devstage::test::make_stream(*backend));
        for (std::size_t i = 0; i < event_count; ++i) events.push_back(devstage::test::make_event(*backend));
        {
            devstage::test::DeviceBytes device(*backend, slice * event_count);
            std::vector<std::vector<std::byte>> in;
            std::vector<std::vector<std::byte>> out(event_count, std::vector<std::byte>(slice));
            for (std::size_t i = 0; i < event_count; ++i) {
                in.push_back(devstage::test::pattern(slice, static_cast<std::uint32_t>(100 + i)));
            }
            // Each slice is written on one stream and read back on the next, which waits for it.
            for (std::size_t i = 0; i < event_count; ++i) {
                const auto writer = streams[i % stream_count];
                const auto reader = streams[(i + 1) % stream_count];
                REQUIRE(backend->copy_to_device_async(device.get() + i * slice, in[i].data(), slice, writer).ok());
                REQUIRE(backend->record_event(events[i], writer).ok());
                REQUIRE(backend->stream_wait_event(reader, events[i]).ok());
                REQUIRE(backend->copy_from_device_async(out[i].data(), device.get() + i * slice, slice, reader).ok());
                REQUIRE(backend->record_event(events[i], reader).ok());
            }
            for (const auto event : events) REQUIRE(backend->synchronize_event(event).ok());
            CHECK(devstage::test::same_bytes(out, in));
        }
        for (const auto event : events) CHECK(backend->destroy_event(event).ok());
        for (const auto stream : streams) CHECK(backend->destroy_stream(stream).ok());
    }
}
