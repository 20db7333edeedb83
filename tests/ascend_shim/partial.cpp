// SPDX-License-Identifier: Apache-2.0
// A libascendcl stand-in that lacks every symbol but aclInit: for the missing-symbol test.
extern "C" int aclInit(const char*) {
    return 0;
}
