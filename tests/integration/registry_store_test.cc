// The SQLite registry store (server/registry_store.h) and file identities, without a daemon.
#include "server/registry_store.h"

#include <sqlite3.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace thermocline::server {
namespace {

using thermocline::testing::TempDir;

ModelRecord Record(const std::string& name, int64_t created) {
  ModelRecord r;
  r.name = name;
  r.path = "/models/" + name + ".gguf";
  r.identity = {123, 456, "00ff"};
  r.activation = "relu";
  r.corpus = "/corpus.txt";
  r.profile_tokens = 777;
  r.created_at = r.updated_at = created;
  return r;
}

TEST_CASE("registry store: rows round-trip and persist across reopening", "[registry][store]") {
  const std::string dir = (TempDir() / "store-roundtrip").string();
  std::filesystem::remove_all(dir);
  {
    auto store = RegistryStore::Open(dir);
    REQUIRE(store.ok());
    REQUIRE((*store)->Insert(Record("b", 20)).ok());
    REQUIRE((*store)->Insert(Record("a", 10)).ok());
    CHECK((*store)->Insert(Record("a", 30)).code() == absl::StatusCode::kAlreadyExists);
    ModelRecord a = Record("a", 10);
    a.state = ModelState::kReady;
    a.gpu_memory = "8G";
    a.gpu_layers = "auto";
    a.target_ppl_increase = 0.025;
    a.stage = "done";
    a.sidecar_path = "/state/a.thermo.gguf";
    a.placement_json = R"({"gpu_neurons":1})";
    a.report_json = R"({"layers":6})";
    a.last_error = "it's \"quoted\"";
    a.updated_at = 99;
    REQUIRE((*store)->Update(a).ok());
    CHECK((*store)->Update(Record("zzz", 1)).code() == absl::StatusCode::kNotFound);
  }
  auto store = RegistryStore::Open(dir);
  REQUIRE(store.ok());
  auto rows = (*store)->LoadAll();
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  const ModelRecord& a = (*rows)[0];  // oldest first
  CHECK(a.name == "a");
  CHECK(a.path == "/models/a.gguf");
  CHECK(a.identity == FileIdentity{123, 456, "00ff"});
  CHECK(a.activation == "relu");
  CHECK(a.corpus == "/corpus.txt");
  CHECK(a.profile_tokens == 777);
  CHECK(a.state == ModelState::kReady);
  CHECK(a.gpu_memory == "8G");
  CHECK(a.gpu_layers == "auto");
  CHECK(a.target_ppl_increase == 0.025);
  CHECK(a.stage == "done");
  CHECK(a.sidecar_path == "/state/a.thermo.gguf");
  CHECK(a.placement_json == R"({"gpu_neurons":1})");
  CHECK(a.report_json == R"({"layers":6})");
  CHECK(a.last_error == "it's \"quoted\"");
  CHECK(a.created_at == 10);
  CHECK(a.updated_at == 99);
  CHECK((*rows)[1].name == "b");
  CHECK((*rows)[1].state == ModelState::kRegistered);
  CHECK((*rows)[1].gpu_memory.empty());
  CHECK((*rows)[1].target_ppl_increase == 0);

  REQUIRE((*store)->Delete("a").ok());
  CHECK((*store)->Delete("a").code() == absl::StatusCode::kNotFound);
  rows = (*store)->LoadAll();
  REQUIRE(rows.ok());
  CHECK(rows->size() == 1);
  CHECK(std::filesystem::exists(std::filesystem::path(dir) / "registry.db"));
}

TEST_CASE("registry store: a schema 2 registry gains the perplexity target, its rows kept",
          "[registry][store]") {
  const std::string dir = (TempDir() / "store-schema2").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {  // registry.db as the previous schema wrote it
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir + "/registry.db").c_str(), &db) == SQLITE_OK);
    const char* v2 =
        "CREATE TABLE models (name TEXT PRIMARY KEY NOT NULL, path TEXT NOT NULL, file_size "
        "INTEGER NOT NULL, file_mtime INTEGER NOT NULL, file_hash TEXT NOT NULL, activation TEXT "
        "NOT NULL, corpus TEXT NOT NULL, profile_tokens INTEGER NOT NULL, state TEXT NOT NULL, "
        "stage TEXT NOT NULL, sidecar_path TEXT NOT NULL, placement_json TEXT NOT NULL, "
        "report_json TEXT NOT NULL, last_error TEXT NOT NULL, created_at INTEGER NOT NULL, "
        "updated_at INTEGER NOT NULL, gpu_memory TEXT NOT NULL DEFAULT '', gpu_layers TEXT NOT "
        "NULL DEFAULT '');"
        "INSERT INTO models VALUES ('old', '/m/old.gguf', 1, 2, 'ab', '', '', 64, 'ready', "
        "'done', '/s/old.thermo.gguf', '', '', '', 5, 6, '4G', '');"
        "PRAGMA user_version=2;";
    REQUIRE(sqlite3_exec(db, v2, nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = RegistryStore::Open(dir);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  auto rows = (*store)->LoadAll();
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 1);
  ModelRecord old = (*rows)[0];
  CHECK(old.name == "old");
  CHECK(old.gpu_memory == "4G");
  CHECK(old.sidecar_path == "/s/old.thermo.gguf");
  CHECK(old.target_ppl_increase == 0);
  old.target_ppl_increase = 0.01;
  REQUIRE((*store)->Update(old).ok());
  rows = (*store)->LoadAll();
  REQUIRE(rows.ok());
  CHECK((*rows)[0].target_ppl_increase == 0.01);
}

TEST_CASE("registry store: an unusable state directory is a clear error", "[registry][store]") {
  const std::string file = (TempDir() / "store-not-a-dir").string();
  std::ofstream(file) << "x";
  auto store = RegistryStore::Open(file + "/sub");
  REQUIRE(!store.ok());
  CHECK(std::string(store.status().message()).find("state directory") != std::string::npos);
}

TEST_CASE("file identity: size, mtime and first-MiB hash", "[registry][store]") {
  const std::string path = (TempDir() / "identity.bin").string();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "hello model";
  auto a = IdentifyFile(path);
  REQUIRE(a.ok());
  CHECK(a->size == 11);
  CHECK(a->hash.size() == 16);
  auto again = IdentifyFile(path);
  REQUIRE(again.ok());
  CHECK(*a == *again);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "hello modem";  // same size
  auto b = IdentifyFile(path);
  REQUIRE(b.ok());
  CHECK(b->hash != a->hash);
  CHECK(IdentifyFile(path + ".missing").status().code() == absl::StatusCode::kNotFound);
  CHECK(IdentifyFile(TempDir().string()).status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace thermocline::server
