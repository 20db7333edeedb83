// SPDX-License-Identifier: Apache-2.0
// The life of a Stager's pipeline slot as a state machine (detail/stager/slot_state.hpp): the
// transition table checked cell by cell against the transitions written out here, and the
// properties the Stager relies on (a failed finish never leaves outputs to deliver; every state
// can be abandoned; only a bound slot finishes).
#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "devstage/detail/stager/slot_state.hpp"

using devstage::detail::next_state;
using devstage::detail::slot_event_count;
using devstage::detail::slot_state_count;
using devstage::detail::SlotEvent;
using devstage::detail::SlotState;

namespace {

using S = SlotState;
using E = SlotEvent;

// The transitions the slot admits, one by one: (from, event, to). Every other pair is refused.
const std::set<std::tuple<S, E, S>> transitions = {
    {S::idle, E::hand_out_frame, S::framed},
    {S::idle, E::bind, S::uploading},
    {S::framed, E::bind_frame, S::uploading},
    {S::framed, E::drop_frame, S::idle},
    {S::uploading, E::uploads_done, S::live},
    {S::uploading, E::finish, S::idle},
    {S::uploading, E::finish_delivering, S::delivering},
    {S::uploading, E::finish_frame, S::held},
    {S::uploading, E::finish_failed, S::idle},
    {S::uploading, E::end, S::idle},
    {S::live, E::finish, S::idle},
    {S::live, E::finish_delivering, S::delivering},
    {S::live, E::finish_frame, S::held},
    {S::live, E::finish_failed, S::idle},
    {S::live, E::end, S::idle},
    {S::delivering, E::settle, S::idle},
    {S::held, E::release_hold, S::idle},
    {S::idle, E::abandon, S::idle},
    {S::framed, E::abandon, S::idle},
    {S::uploading, E::abandon, S::idle},
    {S::live, E::abandon, S::idle},
    {S::delivering, E::abandon, S::idle},
    {S::held, E::abandon, S::idle},
};

std::optional<S> expected(S from, E event) {
    for (const auto& [f, e, to] : transitions) {
        if (f == from && e == event) return to;
    }
    return std::nullopt;
}

}  // namespace

TEST_CASE("slot state: every cell of the transition table", "[slot_state]") {
    std::size_t admitted = 0;
    for (std::size_t s = 0; s < slot_state_count; ++s) {
        for (std::size_t e = 0; e < slot_event_count; ++e) {
            const auto from = static_cast<S>(s);
            const auto event = static_cast<E>(e);
            CAPTURE(std::string(to_string(from)), e);
            CHECK(next_state(from, event) == expected(from, event));
            admitted += next_state(from, event).has_value() ? 1 : 0;
        }
    }
    CHECK(admitted == transitions.size());
}

TEST_CASE("slot state: a failed finish drops its outputs, and only a finish delivers", "[slot_state]") {
    for (std::size_t s = 0; s < slot_state_count; ++s) {
        const auto from = static_cast<S>(s);
        CAPTURE(std::string(to_string(from)));
        const std::optional<S> failed = next_state(from, E::finish_failed);
        if (failed) CHECK(*failed == S::idle);
        for (std::size_t e = 0; e < slot_event_count; ++e) {
            const auto event = static_cast<E>(e);
            if (next_state(from, event) == S::delivering) CHECK(event == E::finish_delivering);
        }
        CHECK(next_state(from, E::abandon) == S::idle);  // the destructor and abandon() end everything
    }
}

TEST_CASE("slot state: the event of a finish, for every outcome", "[slot_state]") {
    using devstage::detail::finish_event;
    // failed, frame, delivers: the event, and the state a live slot goes to.
    const std::tuple<bool, bool, bool, E, S> rows[] = {
        {false, false, false, E::finish, S::idle},
        {false, false, true, E::finish_delivering, S::delivering},
        {false, true, false, E::finish_frame, S::held},
        {false, true, true, E::finish_frame, S::held},  // a frame's packed outputs are in place
        {true, false, false, E::finish_failed, S::idle},
        {true, false, true, E::finish_failed, S::idle},  // the outputs are dropped
        {true, true, false, E::finish_failed, S::idle},
        {true, true, true, E::finish_failed, S::idle},
    };
    for (const auto& [failed, frame, delivers, event, state] : rows) {
        CAPTURE(failed, frame, delivers);
        CHECK(finish_event(failed, frame, delivers) == event);
        CHECK(next_state(S::live, event) == state);
        CHECK(next_state(S::uploading, event) == state);
    }
}

TEST_CASE("slot state: only a bound slot finishes; a taken slot takes no bind or frame", "[slot_state]") {
    for (std::size_t s = 0; s < slot_state_count; ++s) {
        const auto from = static_cast<S>(s);
        CAPTURE(std::string(to_string(from)));
        for (const E finish : {E::finish, E::finish_delivering, E::finish_frame, E::finish_failed, E::end}) {
            CHECK(next_state(from, finish).has_value() == devstage::detail::bound(from));
        }
        CHECK(next_state(from, E::bind).has_value() == (from == S::idle));
        CHECK(next_state(from, E::hand_out_frame).has_value() == (from == S::idle));
        if (devstage::detail::taken(from)) CHECK_FALSE(next_state(from, E::bind).has_value());
    }
    CHECK_FALSE(devstage::detail::taken(S::idle));
    CHECK_FALSE(devstage::detail::taken(S::delivering));  // a bind settles it first
    CHECK(devstage::detail::taken(S::held));
}
