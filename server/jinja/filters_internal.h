// The filters on strings and numbers (filters_scalar.cc), for the filter table (filters.cc).
// Private to server/jinja.
#pragma once

#include "server/jinja/value.h"

namespace thermocline::server::jinja {

Value FString(Interpreter& in, const Value& v, CallArgs& args);
Value FUpper(Interpreter& in, const Value& v, CallArgs& args);
Value FLower(Interpreter& in, const Value& v, CallArgs& args);
Value FCapitalize(Interpreter& in, const Value& v, CallArgs& args);
Value FTitle(Interpreter& in, const Value& v, CallArgs& args);
Value FTrim(Interpreter& in, const Value& v, CallArgs& args);
Value FReplace(Interpreter& in, const Value& v, CallArgs& args);
Value FToJson(Interpreter& in, const Value& v, CallArgs& args);
Value FInt(Interpreter& in, const Value& v, CallArgs& args);
Value FFloat(Interpreter& in, const Value& v, CallArgs& args);
Value FAbs(Interpreter& in, const Value& v, CallArgs& args);
Value FRound(Interpreter& in, const Value& v, CallArgs& args);
Value FIndent(Interpreter& in, const Value& v, CallArgs& args);
Value FCenter(Interpreter& in, const Value& v, CallArgs& args);
Value FWordcount(Interpreter& in, const Value& v, CallArgs& args);
Value FTruncate(Interpreter& in, const Value& v, CallArgs& args);
Value FEscape(Interpreter& in, const Value& v, CallArgs& args);
Value FSafe(Interpreter& in, const Value& v, CallArgs& args);
Value FFormat(Interpreter& in, const Value& v, CallArgs& args);

}  // namespace thermocline::server::jinja
