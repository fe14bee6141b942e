// The values a Jinja template computes with, modelled on the Python objects jinja2 sees: none,
// bool, int, float, str, list/tuple, dict (insertion-ordered), objects (namespace, loop, macros,
// builtin functions) and jinja2's default Undefined. Containers are shared and immutable, as
// the sandbox HF transformers renders with allows no mutation of lists and dicts; a namespace is
// the one mutable object. Strings are UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thermocline::server::jinja {

class Value;
class Object;
class Interpreter;

using ValueList = std::vector<Value>;

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// An insertion-ordered mapping with Python key equality (1, 1.0 and True are one key).
class Dict {
 public:
  using Item = std::pair<Value, Value>;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Adds the pair, or replaces the value of an equal key in place (keeping its position).
  void Set(Value key, Value value);
  const std::vector<Item>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<Item> items_;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // list or tuple
    kDict,
    kObject,
  };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::kBool), int_(b) {}
  Value(int i) : kind_(Kind::kInt), int_(i) {}
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}
  Value(double f) : kind_(Kind::kFloat), float_(f) {}
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}
  Value(std::string_view s) : kind_(Kind::kString), str_(s) {}
  Value(const char* s) : kind_(Kind::kString), str_(s) {}

  static Value None();
  // `hint` is the message an operation on it fails with ("'x' is undefined"); `unsafe` marks
  // the sandbox's refusal of a mutating method, which fails as a security error.
  static Value Undefined(std::string hint, bool unsafe = false);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);
  static Value MakeDict(Dict dict);
  static Value MakeObject(std::shared_ptr<Object> object);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool: Python's numbers.Number.
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool bool_value() const { return int_ != 0; }
  int64_t int_value() const { return int_; }  // int or bool
  double float_value() const { return float_; }
  // int, bool or float as a double.
  double number() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }  // string, or the undefined hint
  bool unsafe() const { return tuple_; }           // undefined from a refused method
  const ValueList& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Object* object() const { return object_.get(); }
  const std::shared_ptr<Object>& object_ptr() const { return object_; }

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;  // kList: a tuple; kUndefined: unsafe
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<const Dict> dict_;
  std::shared_ptr<Object> object_;
};

// Objects other than the plain data types: namespaces, the loop variable, macros, builtin
// functions and bound methods.
class Object {
 public:
  virtual ~Object() = default;
  // The Python type name, for messages ("Namespace", "LoopContext", "Macro", ...).
  virtual std::string TypeName() const = 0;
  // An attribute the sandbox lets a template read; nullopt when there is none.
  virtual std::optional<Value> GetAttr(std::string_view name) const { return std::nullopt; }
  virtual bool callable() const { return false; }
  // Throws a render error unless callable().
  virtual Value Call(Interpreter& in, CallArgs& args) const;
  // str() of the object.
  virtual std::string Str() const;
};

// Python truthiness.
bool Truthy(const Value& v);
// Python ==, with jinja2's Undefined (equal only to another Undefined).
bool Equal(const Value& a, const Value& b);
// Python <; throws a render error for unordered types.
bool Less(const Value& a, const Value& b);
// The Python type name ("str", "int", "NoneType", "dict", ...).
std::string TypeName(const Value& v);
// Python str() and repr().
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
// Python repr() of a float ("1.0", "1e-05", "inf").
std::string FloatRepr(double f);

}  // namespace thermocline::server::jinja
