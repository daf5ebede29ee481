# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image <-> version table (``data/images.yml``): which vLLM and vllm-ascend an image tag carries and what
that version has (parsers, tokenizer modes, KV-cache dtypes, bench result fields, PD proxy routes).

Pure functions over the table; the planner refuses a preset the image cannot serve (``preset_problems``),
preflight reads the driver / CANN minimums (``image_versions``), the simulator emulates the version its tag
claims and docs/versions.md shows the same table.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog

# preset field -> (capability list of the vLLM version, the `vllm serve` flag)
PRESET_FIELDS = (
    ("reasoning_parser", "reasoning_parsers", "--reasoning-parser"),
    ("tool_call_parser", "tool_call_parsers", "--tool-call-parser"),
    ("tokenizer_mode", "tokenizer_modes", "--tokenizer-mode"),
    ("kv_cache_dtype", "kv_cache_dtypes", "--kv-cache-dtype"),
)


def table():
    """The parsed ``data/images.yml``."""
    return catalog.load("images")


def image_tag(image):
    """The tag of an image reference (a digest after it is ignored; no tag is ``latest``, as docker pulls it; a
    digest alone names no tag: None)."""
    ref, digest = (str(image or "").split("@", 1) + [""])[:2]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        return last.split(":", 1)[1]
    return None if digest else "latest"


def image_digest(image):
    """The ``sha256:...`` digest an image reference pins, or None."""
    return str(image or "").split("@", 1)[1] if "@" in str(image or "") else None


def image_versions(image, data=None):
    """-> {tag, vllm, vllm_ascend, proxy, min_driver, min_cann, known} of the first matching line, plus the
    vLLM version's capabilities (reasoning_parsers, tool_call_parsers, tokenizer_modes, kv_cache_dtypes,
    reasoning_field, bench_latencies) and the proxy's (proxy_routes, proxy_prefill_error, proxy_decode_error).
    ``known`` is false (and the versions None) for a tag the table has no line for."""
    data = data if data is not None else table()
    tag = image_tag(image)
    for line in data.get("images") or []:
        if tag is not None and re.search(line["tag_pattern"], tag):
            return dict(line_versions(line, data, tag), digest=image_digest(image))
    return {"tag": tag, "digest": image_digest(image), "known": False, "vllm": None, "vllm_ascend": None, "line": None,
            "proxy": None, "min_driver": None, "min_cann": None}


def lines(data=None):
    """vLLM-Ascend's release lines, oldest first (data/images.yml `lines`)."""
    data = data if data is not None else table()
    return [str(x) for x in data.get("lines") or []]


def line_rank(line, data=None):
    """The position of a line among lines() (newer is larger), or None for a line the table does not list."""
    order = lines(data)
    return order.index(str(line)) if line is not None and str(line) in order else None


def with_registrations(caps, registers):
    """Add what vllm-ascend registers ({capability: [names]}) to vLLM's capability lists, in place."""
    for field, names in (registers or {}).items():
        caps[field] = list(caps.get(field) or []) + [n for n in names if n not in (caps.get(field) or [])]
    return caps


def missing(needs, caps):
    """(field, capability, flag, value) of every need (PRESET_FIELDS) that the capability lists `caps` lack."""
    for field, capability, flag in PRESET_FIELDS:
        value = (needs or {}).get(field)
        if value in (None, "") or (field == "kv_cache_dtype" and value == "auto") or value in (caps.get(capability) or []):
            continue
        yield field, capability, flag, value


def line_versions(line, data=None, tag=None):
    """image_versions() of one line of the table."""
    data = data if data is not None else table()
    out = dict(line, tag=tag, known=True, vllm=str(line["vllm"]), vllm_ascend=str(line["vllm_ascend"]),
               line=str(line.get("line") or line["vllm_ascend"]))
    # what the line's images carry besides vLLM (CANN, Mooncake) and what it refuses; an image's own entry wins
    for key, value in ((data.get("line_facts") or {}).get(out["line"]) or {}).items():
        out.setdefault(key, value)
    out.update((data.get("vllm") or {}).get(out["vllm"]) or {})
    # what vllm-ascend registers on top of vLLM in this image serves as well as vLLM's own
    registers = line.get("vllm_ascend_registers") or {}
    with_registrations(out, registers)
    out["vllm_ascend_registers"] = dict(registers)
    proxy = (data.get("proxy") or {}).get(str(line.get("proxy"))) or {}
    out.update(proxy_routes=proxy.get("routes") or [], proxy_prefill_error=proxy.get("prefill_error"),
               proxy_decode_error=proxy.get("decode_error"))
    return out


def known_tags(data=None):
    """The tag patterns of the table, for messages."""
    data = data if data is not None else table()
    return [line["tag_pattern"] for line in data.get("images") or []]


def images_with(field, value, data=None):
    """Tag patterns whose vLLM version has `value` in capability list `field` (for the fix of a refusal)."""
    data = data if data is not None else table()
    return [line["tag_pattern"] for line in data.get("images") or []
            if value in (line_versions(line, data).get(field) or [])]


def preset_problems(preset, image, preset_name=None, data=None, where=None):
    """What the preset (or a command's needs, named by ``where``) needs that the image's vLLM lacks: one string per
    problem, naming the image, the field and the fix. An image the table does not know is a problem too (nothing could
    be checked)."""
    data = data if data is not None else table()
    where = where or ("preset %s" % preset_name if preset_name else "the model preset")
    info = image_versions(image, data)
    if not info["known"]:
        if info["tag"] is None:
            return ["npuops_image %s: a digest alone names no tag, so %s cannot be checked against its vLLM; write the "
                    "tag before the digest (repository:tag@sha256:..., as `docker images --digests` shows it)"
                    % (image, where)]
        return ["npuops_image %s: tag %r is not in the image version table (data/images.yml: %s), so %s cannot be "
                "checked against its vLLM; use a listed image line or add this tag's line (vLLM and vllm-ascend "
                "versions and what they have) to the table"
                % (image, info["tag"], ", ".join(known_tags(data)), where)]
    return capability_problems(preset, info, image, where, data)


def capability_problems(preset, info, image, where, data=None):
    """preset_problems() against one line_versions() / image_versions() result."""
    data = data if data is not None else table()
    problems = []
    for field, capability, flag, value in missing(preset, info):
        have = info.get(capability) or []
        fix = "use an image that has it (%s)" % ", ".join(images_with(capability, value, data)) \
            if images_with(capability, value, data) else "no image in the table has it"
        if field == "kv_cache_dtype" and str(value) == "int8":
            fix += ("; int8 KV (C8) on vllm-ascend comes from the checkpoint's quantization (quant_model_description "
                    "kv_cache_type: C8), so set kv_cache_dtype: auto and kv_cache_quant: C8")
        problems.append("npuops_image %s (vLLM %s, vllm-ascend %s): %s sets %s: %s (%s %s), which neither this vLLM "
                        "nor its vllm-ascend has (they have: %s); %s, or set npuops_model_overrides: {%s: ...}"
                        % (image, info["vllm"], info["vllm_ascend"], where, field, value, flag, value,
                           ", ".join(have), fix, field))
    return problems


def held_capabilities(held, image, data=None):
    """What an image really holds can serve: the capabilities of the vLLM version read from it (``held``: the
    versions image_probe read), plus what its line's vllm-ascend registers when the image holds that line's vLLM and
    vllm-ascend. -> (capabilities, known): known is false when the table has no entry for that vLLM version."""
    data = data if data is not None else table()
    vllm_version = str((held or {}).get("vllm"))
    caps = dict((data.get("vllm") or {}).get(vllm_version) or {})
    known = bool(caps)
    info = image_versions(image, data)
    if info["known"] and vllm_version == info["vllm"] and str((held or {}).get("vllm_ascend")) == info["vllm_ascend"]:
        with_registrations(caps, info.get("vllm_ascend_registers"))
    return caps, known


def differing_images(reads):
    """``reads``: [(host, what image_probe read)] of the nodes of one instance -> [(host, its id, first host, the first
    id)] for every node whose image (registry digest, else image id) is not the first node's."""
    ids = [(h, r.get("digest") or r.get("id")) for h, r in reads if r and (r.get("digest") or r.get("id"))]
    return [(h, ident, ids[0][0], ids[0][1]) for h, ident in ids[1:] if ident != ids[0][1]]


def held_text(held):
    return ", ".join("%s %s" % (name, (held or {}).get(key) or "none") for key, name in (
        ("vllm", "vLLM"), ("vllm_ascend", "vllm-ascend"), ("torch_npu", "torch_npu"), ("cann", "CANN")))


def held_problems(needs, held, image, where, data=None):
    """What a command needs (``needs``: reasoning_parser, tool_call_parser, tokenizer_mode, kv_cache_dtype) that the
    versions read from the image cannot serve: -> (errors, warnings), each a string naming the image, what it holds and
    what is needed."""
    data = data if data is not None else table()
    caps, known = held_capabilities(held, image, data)
    if not known:
        return [], ["%s holds %s (read from the image), and data/images.yml has no entry for vLLM %s, so what %s needs "
                    "was not checked" % (image, held_text(held), (held or {}).get("vllm"), where)]
    errors = []
    for _field, capability, flag, value in missing(needs, caps):
        having = ", ".join(images_with(capability, value, data)) or "none in the table"
        errors.append("%s holds %s (read from the image): %s needs %s %s, which neither its vLLM nor its vllm-ascend "
                      "has; use an image that has it (%s)" % (image, held_text(held), where, flag, value, having))
    warnings = []
    info = image_versions(image, data)
    if info["known"] and str((held or {}).get("vllm")) != info["vllm"]:
        warnings.append("%s holds vLLM %s, its tag's line says %s: the tag was moved or the image was built from "
                        "elsewhere; pin the digest" % (image, (held or {}).get("vllm"), info["vllm"]))
    return errors, warnings


# Fabric memory on Atlas 800 A3 (ASCEND_ENABLE_USE_FABRIC_MEM=1, "unified memory address direct transmission"):
# vllm-ascend docs/source/user_guide/feature_guide/kv_pool.md (#14551), the "800 I/T A3 series" row: "HDK >= 26.0 or
# HDK >= 25.5 with mooncake >= v0.3.11, CANN >= 9.0.0, LingQu Computing Network >= 1.5". LingQu's version is not read
# (no tool prints it that npuops knows); npuops_fabric_mem: false is the operator's way to say it is older.
FABRIC_MEM = {"hdk": "26.0", "hdk_with_mooncake": "25.5", "mooncake": "0.3.11", "cann": "9.0.0"}


def _vt(text):
    from ansible_collections.npuops.ascend.plugins.module_utils.npu_smi import version_tuple
    return version_tuple(text)


def fabric_mem_shortfall(hdk, cann, mooncake):
    """What a node lacks for fabric memory ([] when it has it): its HDK (driver), the CANN and Mooncake its engine's
    image carries; a version that could not be read counts as lacking (nothing proves it)."""
    out = []
    if not hdk:
        out.append("its HDK (driver) version could not be read")
    elif _vt(hdk) < _vt(FABRIC_MEM["hdk"]):
        if _vt(hdk) < _vt(FABRIC_MEM["hdk_with_mooncake"]):
            out.append("HDK %s < %s" % (hdk, FABRIC_MEM["hdk_with_mooncake"]))
        elif not mooncake:
            out.append("HDK %s < %s and the image's Mooncake version could not be read (>= %s needed below HDK %s)"
                       % (hdk, FABRIC_MEM["hdk"], FABRIC_MEM["mooncake"], FABRIC_MEM["hdk"]))
        elif _vt(mooncake) < _vt(FABRIC_MEM["mooncake"]):
            out.append("HDK %s < %s with Mooncake %s < %s" % (hdk, FABRIC_MEM["hdk"], mooncake, FABRIC_MEM["mooncake"]))
    if not cann:
        out.append("the image's CANN version could not be read")
    elif _vt(cann) < _vt(FABRIC_MEM["cann"]):
        out.append("CANN %s < %s" % (cann, FABRIC_MEM["cann"]))
    return out


def jemalloc_preloads(preload):
    """Where a process of the image preloads jemalloc ({env, file} as image_probe reads it): ["LD_PRELOAD=...",
    "/etc/ld.so.preload: ..."]."""
    out = []
    if "jemalloc" in str((preload or {}).get("env") or ""):
        out.append("LD_PRELOAD=%s" % preload["env"])
    if "jemalloc" in str((preload or {}).get("file") or ""):
        out.append("/etc/ld.so.preload: %s" % " ".join(str(preload["file"]).split()))
    return out
