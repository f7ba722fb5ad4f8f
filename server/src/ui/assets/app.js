// Spool dashboard. Plain browser JavaScript, no dependencies, no build step.
//
// Security rule for this file: server data only ever reaches the page through
// textContent / text nodes / attribute values set by el() below. Never use
// innerHTML & co: activity payloads are arbitrary user data.
"use strict";

(() => {
  // ---- State --------------------------------------------------------------

  const TOKEN_KEY = "spool.token";
  const NS_KEY = "spool.namespace";
  const POLL_MS = 2000;
  const STATUSES = ["SCHEDULED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"];

  const state = {
    token: null,
    session: null,
    namespace: sessionStorage.getItem(NS_KEY) ?? "default",
    // Bumped on every navigation / sign-out so late responses from the
    // previous page are dropped instead of drawn over the new one.
    gen: 0,
    refresh: null,   // current page's poll function
    timer: null,
    busyGen: null,   // generation whose refresh is in flight
    again: false,    // a refresh was requested while one was in flight
    flashSource: null,
  };

  const $ = (id) => document.getElementById(id);
  const canWrite = () => !!(state.session && state.session.can_write && !state.session.read_only);
  const liveCheck = () => {
    const gen = state.gen;
    return () => gen === state.gen && state.session !== null;
  };

  // ---- DOM helpers ----------------------------------------------------------

  // el("a", {href: "#/x", class: "c", onclick: fn}, "text", childNode, [more])
  // Strings become text nodes, so markup in data is shown literally.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (typeof v === "function") node.addEventListener(k.replace(/^on/, ""), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(node, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  // Replace a container's children (a table body, usually) without stealing
  // focus from the user: elements tagged data-focus get focus back after.
  function swap(container, nodes) {
    const active = document.activeElement;
    const focusKey = active && container.contains(active) ? active.getAttribute("data-focus") : null;
    container.replaceChildren(...[nodes].flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
    if (!focusKey) return;
    for (const n of container.querySelectorAll("[data-focus]")) {
      if (n.getAttribute("data-focus") === focusKey) { n.focus(); break; }
    }
  }

  // Re-render a section only when its data changed, so polling does not reset
  // text selections or scroll positions inside unchanged payloads.
  const signatures = new WeakMap();
  function patch(node, value, build) {
    const sig = "v:" + JSON.stringify(value); // "v:" so undefined still renders once
    if (signatures.get(node) === sig) return;
    signatures.set(node, sig);
    swap(node, [build(value)]);
  }

  const tableWrap = (table) => el("div", { class: "table-wrap" }, table);
  const thead = (cols) => el("thead", {}, el("tr", {}, cols.map((c) =>
    Array.isArray(c) ? el("th", { class: c[1], scope: "col" }, c[0]) : el("th", { scope: "col" }, c))));
  const messageRow = (cols, text, cls = "muted") =>
    el("tr", { class: "message-row" }, el("td", { colspan: cols, class: cls }, text));
  const field = (label, input) => el("div", { class: "field" }, el("label", { for: input.id }, label), input);

  function href(path, params) {
    const q = qs(params || {});
    return "#/" + path + (q ? "?" + q : "");
  }

  function qs(params) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
    }
    return p.toString();
  }

  // ---- Formatting -------------------------------------------------------------

  const pad = (n) => String(n).padStart(2, "0");
  const localTime = (d) =>
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const clock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;

  function timeEl(iso) {
    if (!iso) return el("span", { class: "muted" }, "—");
    const d = new Date(iso);
    if (isNaN(d.getTime())) return el("span", {}, String(iso));
    return el("time", { datetime: iso, title: iso }, localTime(d));
  }

  function fmtDuration(ms) {
    if (ms === null || !Number.isFinite(ms) || ms < 0) return "—";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  function fmtBytes(n) {
    if (!Number.isFinite(n)) return "? bytes";
    if (n < 1024) return `${n} bytes`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  }

  const fmtNum = (n) => Number(n || 0).toLocaleString();
  const cut = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);
  const keyOf = (a) => `${a.workflow_id}/${a.activity_id}`;
  const errorText = (e) => (e ? `${e.type || "error"}: ${e.message || ""}` : "");
  const attemptText = (a) => `${a.attempt ?? 0}/${a.max_attempts ? a.max_attempts : "∞"}`;
  const detailHref = (ns, wf, id) => href("activity", { ns, wf, id });

  function statusBadge(status, attrs) {
    const s = String(status || "UNKNOWN");
    return el("span", Object.assign({ class: "badge status-" + s.toLowerCase() }, attrs), s);
  }

  function errorCell(e) {
    if (!e) return el("span", { class: "muted" }, "—");
    const full = errorText(e);
    return el("span", { title: full }, cut(full, 80));
  }

  // ---- API ------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // GET when body is undefined, else POST with a JSON body. A 401 anywhere
  // means the token is no good any more, so go straight back to sign-in
  // (unless `quiet`: asking whether a token is needed at all).
  async function api(path, body, quiet) {
    const opts = {
      method: body === undefined ? "GET" : "POST",
      headers: { Authorization: "Bearer " + (state.token || "") },
      cache: "no-store",
      credentials: "same-origin",
    };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      throw new ApiError(0, "Cannot reach the Spool server (" + e.message + ")", "UNAVAILABLE");
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (!res.ok) {
      const msg = (data && data.error) || `HTTP ${res.status} ${res.statusText}`.trim();
      if (res.status === 401 && !quiet) showSignIn(msg);
      throw new ApiError(res.status, msg, data && data.code);
    }
    return data || {};
  }

  // POST /api/retry or /api/cancel and report "Re-drove N of M" in #flash.
  async function bulkAction(kind, ns, keys) {
    const body = { namespace: ns, keys };
    if (kind === "cancel") body.reason = "Cancelled from the web dashboard";
    const d = await api("/api/" + kind, body);
    const results = d.results || [];
    const ok = results.filter((r) => r.ok).length;
    const failures = results.filter((r) => !r.ok)
      .map((r) => `${r.workflow_id}/${r.activity_id}: ${r.error || "refused"}`);
    const verb = kind === "retry" ? "Re-drove" : "Cancelled";
    flash(`${verb} ${ok} of ${keys.length}`, { error: failures.length > 0, details: failures });
    return results;
  }

  // ---- Flash messages -----------------------------------------------------------

  // source "poll" marks errors from background refreshes, which are cleared
  // automatically once polling works again; action results stay until dismissed.
  function flash(message, opts = {}) {
    const box = $("flash");
    swap(box, [
      el("span", { class: "flash-text" }, message),
      opts.details && opts.details.length ? el("ul", {}, opts.details.map((d) => el("li", {}, d))) : null,
      el("button", { type: "button", class: "flash-close", "aria-label": "Dismiss message", onclick: clearFlash }, "×"),
    ]);
    box.className = opts.error ? "flash error" : "flash ok";
    box.hidden = false;
    state.flashSource = opts.source || "action";
  }

  function clearFlash() {
    const box = $("flash");
    box.hidden = true;
    box.replaceChildren();
    box.className = "";
    state.flashSource = null;
  }

  function reportError(e, source) {
    if (e && e.status === 401) return; // already back on the sign-in form
    flash((e && e.message) || String(e), { error: true, source });
  }

  // ---- Sign-in / session ----------------------------------------------------------

  function showSignIn(message) {
    stopPolling();
    state.gen++;
    state.session = null;
    state.token = null;
    state.refresh = null;
    sessionStorage.removeItem(TOKEN_KEY);
    clearFlash();
    $("page").replaceChildren();
    $("app-view").hidden = true;
    $("sign-in-view").hidden = false;
    const err = $("sign-in-error");
    err.textContent = message || "";
    err.hidden = !message;
    $("sign-in").disabled = false;
    $("token").value = "";
    $("token").focus();
  }

  function enterApp(session) {
    state.session = session;
    const s = session;
    const version = String(s.version || "?");
    let who = `${s.role || "unknown"} · ${version.startsWith("v") ? version : "v" + version}`;
    if (s.read_only || !s.can_write) who += " · read-only";
    $("whoami").textContent = who;
    $("nav-drain").hidden = !s.can_admin;
    $("sign-out").hidden = !s.auth_required;

    // Suggest the namespaces the token may see; start in one of them when
    // "default" is not allowed and the user never picked one.
    const list = Array.isArray(s.namespaces) ? s.namespaces : [];
    $("namespace-list").replaceChildren(...list.map((n) => el("option", { value: n })));
    if (sessionStorage.getItem(NS_KEY) === null && list.length && !list.includes(state.namespace)) {
      state.namespace = list[0];
    }
    $("namespace").value = state.namespace;

    $("sign-in-view").hidden = true;
    $("app-view").hidden = false;
    if (!location.hash || location.hash === "#" || location.hash === "#/") {
      history.replaceState(null, "", "#/overview");
    }
    route();
  }

  async function signIn(ev) {
    ev.preventDefault();
    const btn = $("sign-in");
    btn.disabled = true;
    state.token = $("token").value.trim();
    try {
      const s = await api("/api/session");
      sessionStorage.setItem(TOKEN_KEY, state.token);
      $("token").value = "";
      enterApp(s);
    } catch (e) {
      if (e.status !== 401) showSignIn(e.message); // 401 already handled by api()
    } finally {
      btn.disabled = false;
    }
  }

  // ---- Routing & polling ----------------------------------------------------------

  function parseHash() {
    const h = location.hash.replace(/^#\/?/, "");
    const i = h.indexOf("?");
    const path = i < 0 ? h : h.slice(0, i);
    return { path: path || "overview", params: new URLSearchParams(i < 0 ? "" : h.slice(i + 1)) };
  }

  const PAGES = {
    overview: pageOverview,
    activities: pageActivities,
    activity: pageActivity,
    "dead-letters": pageDeadLetters,
    workers: pageWorkers,
    limits: pageLimits,
    drain: pageDrain,
  };

  function route() {
    if (!state.session) return;
    const { path, params } = parseHash();
    stopPolling();
    state.gen++;
    state.refresh = null;
    state.again = false;
    const navFor = path === "activity" ? "activities" : path;
    for (const a of document.querySelectorAll(".nav a")) {
      const on = a.id === "nav-" + navFor;
      a.classList.toggle("active", on);
      if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    }
    const build = PAGES[path] || pageNotFound;
    $("page").replaceChildren(build(params));
    runRefresh();
  }

  // One refresh at a time; the next one is scheduled only after the previous
  // finished, so a slow server never builds up a queue of requests.
  async function runRefresh() {
    const gen = state.gen;
    const refresh = state.refresh;
    if (!refresh) return;
    if (state.busyGen === gen) { state.again = true; return; }
    stopPolling();
    state.busyGen = gen;
    try {
      const drawn = await refresh();
      if (gen === state.gen && drawn !== false) {
        $("updated").textContent = "updated " + clock(new Date());
        if (state.flashSource === "poll") clearFlash();
      }
    } catch (e) {
      if (gen === state.gen) {
        reportError(e, "poll");
        for (const n of document.querySelectorAll("#page .loading")) n.textContent = "Could not load: " + e.message;
      }
    } finally {
      if (state.busyGen === gen) state.busyGen = null;
    }
    if (gen !== state.gen) return;
    if (state.again) { state.again = false; runRefresh(); } else schedule();
  }

  function schedule() {
    stopPolling();
    if (state.refresh && document.visibilityState === "visible") state.timer = setTimeout(runRefresh, POLL_MS);
  }

  function stopPolling() {
    clearTimeout(state.timer);
    state.timer = null;
  }

  // ---- Page: overview -----------------------------------------------------------

  const TOTALS = [["scheduled", "Scheduled"], ["running", "Running"], ["completed", "Completed"],
    ["failed", "Failed"], ["cancelled", "Cancelled"]];

  function pageOverview() {
    const ns = state.namespace, live = liveCheck();
    const bannerSlot = el("div");
    const cards = el("div", { class: "cards" }, el("p", { class: "loading muted" }, "Loading…"));
    const tbody = el("tbody", {}, messageRow(6, "Loading…", "loading muted"));
    const root = el("section", { "data-page": "overview" },
      el("h1", {}, "Overview ", el("span", { class: "ns-tag" }, ns || "all namespaces")),
      bannerSlot, cards,
      el("h2", {}, "Activity types"),
      tableWrap(el("table", { id: "types" },
        thead(["Type", ["Due", "num"], ["Delayed", "num"], ["Running", "num"], ["Failed", "num"],
          ["Completed /min (this node)", "num"]]), tbody)));

    state.refresh = async () => {
      const d = await api("/api/overview?" + qs({ namespace: ns }));
      if (!live()) return false;
      patch(bannerSlot, d.draining, (draining) => draining
        ? [el("div", { id: "draining-banner", class: "banner warn", role: "status" },
          "This node is draining: it hands out no new work until it is resumed.")]
        : []);
      const t = d.totals || {};
      patch(cards, [t, d.connected_workers], () => [
        ...TOTALS.map(([k, label]) => el("a", {
          class: "card card-" + k, "data-total": k, href: href("activities", { status: k.toUpperCase() }),
        }, el("span", { class: "card-label" }, label), el("span", { class: "card-value" }, fmtNum(t[k])))),
        el("a", { class: "card card-workers", "data-total": "workers", href: "#/workers" },
          el("span", { class: "card-label" }, "Workers"), el("span", { class: "card-value" }, fmtNum(d.connected_workers))),
      ]);
      const types = d.types || [];
      patch(tbody, [types, d.throughput_minutes], () => types.length
        ? types.map((t) => typeRow(t, d.throughput_minutes))
        : [messageRow(6, "No activities in this namespace yet.")]);
    };
    return root;
  }

  function typeRow(t, minutes) {
    const tp = Array.isArray(t.throughput) ? t.throughput : [];
    const last = tp.length ? tp[tp.length - 1] : 0;
    return el("tr", { "data-type": t.activity_type },
      el("td", {}, el("a", { href: href("activities", { type: t.activity_type }), "data-focus": "type:" + t.activity_type },
        t.activity_type)),
      ["due", "delayed", "running", "failed"].map((k) => el("td", { class: "num" }, fmtNum(t[k]))),
      el("td", { class: "num throughput", title: `Completions per minute over the last ${minutes || tp.length} minutes, oldest first: ${tp.join(", ")}` },
        el("span", { class: "tp-value" }, fmtNum(last)), " ", sparkline(tp)));
  }

  // Tiny line chart; the y axis is scaled per row so quiet types still show shape.
  function sparkline(values) {
    const w = 80, h = 20;
    let vals = values.map((v) => Number(v) || 0);
    if (vals.length === 1) vals = [vals[0], vals[0]];
    const box = svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, width: w, height: h, "aria-hidden": "true" });
    if (vals.length < 2) return box;
    const max = Math.max(1, ...vals);
    const step = w / (vals.length - 1);
    const pts = vals.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`);
    box.appendChild(svg("polyline", { class: "spark-line", points: pts.join(" ") }));
    const [lx, ly] = pts[pts.length - 1].split(",");
    box.appendChild(svg("circle", { class: "spark-dot", cx: lx, cy: ly, r: 1.8 }));
    return box;
  }

  // ---- Page: activities -------------------------------------------------------------

  function pageActivities(params) {
    const ns = state.namespace, live = liveCheck();
    const wanted = (params.get("status") || "").toUpperCase();
    const f = {
      status: STATUSES.includes(wanted) ? wanted : "",
      type: params.get("type") || "",
      workflow: params.get("workflow") || "",
      activity: params.get("activity") || "",
    };

    const status = el("select", { id: "filter-status" }, el("option", { value: "" }, "All"),
      STATUSES.map((s) => el("option", { value: s, selected: s === f.status }, s)));
    const type = el("input", { id: "filter-type", type: "text", value: f.type, spellcheck: "false", placeholder: "any" });
    const wf = el("input", { id: "filter-workflow", type: "text", value: f.workflow, spellcheck: "false", placeholder: "any" });
    const act = el("input", { id: "filter-activity", type: "text", value: f.activity, spellcheck: "false", placeholder: "any" });
    const search = el("button", { type: "button", id: "search", class: "primary" }, "Search");

    // Filters live in the hash so a search is a shareable link; navigating
    // re-renders the page (route() also runs when the hash did not change).
    const doSearch = () => {
      const target = href("activities", { status: status.value, type: type.value.trim(), workflow: wf.value.trim(), activity: act.value.trim() });
      const before = location.hash;
      location.hash = target;
      if (location.hash === before) route();
    };
    search.addEventListener("click", doSearch);
    const form = el("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); doSearch(); } },
      field("Status", status), field("Type", type), field("Workflow ID", wf), field("Activity ID", act),
      el("div", { class: "field field-button" }, search));
    form.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && e.target.tagName === "INPUT") { e.preventDefault(); doSearch(); }
    });

    const tbody = el("tbody", {}, messageRow(6, "Loading…", "loading muted"));
    const more = el("button", { type: "button", id: "more", hidden: true }, "More");
    const paused = el("p", { class: "muted small", hidden: true },
      "Live updates are paused while more than one page is shown. Search again to resume.");
    const count = el("p", { class: "muted small result-count" });
    const root = el("section", { "data-page": "activities" },
      el("h1", {}, "Activities ", el("span", { class: "ns-tag" }, ns || "all namespaces")),
      form, count,
      tableWrap(el("table", { id: "activities" },
        thead(["Workflow / Activity", "Type", "Status", ["Attempt", "num"], "Created", "Last error"]), tbody)),
      el("div", { class: "more-row" }, more), paused);

    let items = [], next = "", paged = false;
    const query = (token) => "/api/activities?" + qs({
      namespace: ns, status: f.status, activity_type: f.type, workflow_id: f.workflow,
      activity_id: f.activity, page_token: token, page_size: 50,
    });
    const render = () => {
      patch(tbody, items, () => items.length ? items.map((a) => activityRow(a, ns)) : [messageRow(6, "No activities match these filters.")]);
      more.hidden = !next;
      paused.hidden = !paged;
      count.textContent = `${items.length} shown${next ? ", more available" : ""}`;
    };

    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        const d = await api(query(next));
        if (!live()) return;
        paged = true;
        items = items.concat(d.activities || []);
        next = d.next_page_token || "";
        render();
      } catch (e) {
        reportError(e);
      } finally {
        more.disabled = false;
      }
    });

    // Only the first page is polled: re-fetching appended pages would shift
    // rows under the user's eyes.
    state.refresh = async () => {
      if (paged) return false;
      const d = await api(query(""));
      if (!live() || paged) return false;
      items = d.activities || [];
      next = d.next_page_token || "";
      render();
    };
    return root;
  }

  function activityRow(a, ns) {
    const key = keyOf(a);
    return el("tr", { "data-key": key },
      el("td", { class: "key" }, el("a", { href: detailHref(a.namespace || ns, a.workflow_id, a.activity_id), "data-focus": "link:" + key }, key)),
      el("td", {}, a.activity_type),
      el("td", {}, statusBadge(a.status)),
      el("td", { class: "num" }, attemptText(a)),
      el("td", {}, timeEl(a.created_at)),
      el("td", { class: "err" }, errorCell(a.last_error)));
  }

  // ---- Page: activity detail ----------------------------------------------------------

  function pageActivity(params) {
    const ns = params.get("ns") ?? state.namespace;
    const wf = params.get("wf") || "", id = params.get("id") || "";
    const live = liveCheck(), writable = canWrite();

    const badge = el("span", { id: "detail-status", class: "badge" }, "…");
    const retry = el("button", { type: "button", id: "retry", class: "primary", hidden: true, disabled: !writable }, "Re-drive");
    const cancel = el("button", { type: "button", id: "cancel", class: "danger", hidden: true, disabled: !writable }, "Cancel");
    const doAction = async (kind, btn) => {
      btn.disabled = true;
      try { await bulkAction(kind, ns, [{ workflow_id: wf, activity_id: id }]); } catch (e) { reportError(e); }
      btn.disabled = !canWrite();
      runRefresh();
    };
    retry.addEventListener("click", () => doAction("retry", retry));
    cancel.addEventListener("click", () => doAction("cancel", cancel));

    const facts = el("dl", { class: "facts" }, el("dt", { class: "loading muted" }, "Loading…"));
    const headers = el("div", { class: "section-body" });
    const sections = {};
    for (const [sid, title] of [["input", "Input"], ["output", "Output"], ["last-error", "Last error"], ["heartbeat", "Heartbeat details"]]) {
      sections[sid] = el("div", { class: "section-body" });
      sections[sid + ":root"] = el("section", { id: sid, class: "panel" }, el("h2", {}, title), sections[sid]);
    }
    const historyBody = el("tbody");

    const root = el("section", { "data-page": "activity" },
      el("p", { class: "crumbs" }, el("a", { href: "#/activities" }, "← Activities")),
      el("div", { class: "detail-head" },
        el("h1", { class: "key" }, `${wf}/${id}`), badge,
        el("div", { class: "actions" }, retry, cancel)),
      el("section", { class: "panel" }, facts),
      el("section", { id: "headers", class: "panel" }, el("h2", {}, "Headers"), headers),
      el("div", { class: "payload-grid" }, sections["input:root"], sections["output:root"]),
      sections["last-error:root"], sections["heartbeat:root"],
      el("h2", {}, "Attempt history"),
      tableWrap(el("table", { id: "history" },
        thead([["#", "num"], "Outcome", "Started", "Ended", ["Duration", "num"], "Worker", "Error"]), historyBody)));

    state.refresh = async () => {
      const a = await api("/api/activity?" + qs({ namespace: ns, workflow_id: wf, activity_id: id }));
      if (!live()) return false;
      const st = String(a.status || "");
      badge.className = "badge status-" + st.toLowerCase();
      badge.textContent = st;
      retry.hidden = !writable || !["FAILED", "CANCELLED"].includes(st);
      cancel.hidden = !writable || !["SCHEDULED", "RUNNING"].includes(st);

      patch(facts, [a.namespace, a.activity_type, a.attempt, a.max_attempts, a.counted_attempts, a.created_at,
        a.next_at, a.started_at, a.finished_at, a.worker_id, a.concurrency_key, a.fairness_key,
        a.waiting_reason], () => [
        fact("Namespace", a.namespace || ns),
        fact("Type", a.activity_type),
        ...(a.waiting_reason ? [fact("Waiting", a.waiting_reason)] : []),
        fact("Attempt", attemptText(a)),
        fact("Counted attempts", String(a.counted_attempts ?? "—")),
        fact("Created", timeEl(a.created_at)),
        fact("Next run", timeEl(a.next_at)),
        fact("Started", timeEl(a.started_at)),
        fact("Finished", timeEl(a.finished_at)),
        fact("Worker", a.worker_id || el("span", { class: "muted" }, "—")),
        ...(a.concurrency_key ? [fact("Concurrency key", a.concurrency_key)] : []),
        ...(a.fairness_key ? [fact("Fairness key", a.fairness_key)] : []),
      ]);
      patch(headers, a.headers || {}, (h) => {
        const entries = Object.entries(h);
        if (!entries.length) return el("p", { class: "muted" }, "No headers.");
        return tableWrap(el("table", { class: "kv" }, thead(["Name", "Value"]),
          el("tbody", {}, entries.map(([k, v]) => el("tr", {}, el("td", { class: "mono" }, k), el("td", { class: "mono wrap" }, String(v)))))));
      });
      patch(sections.input, a.input, payloadView);
      patch(sections.output, a.output, payloadView);
      patch(sections.heartbeat, a.heartbeat_details, payloadView);
      patch(sections["last-error"], a.last_error, (e) => e ? [
        el("dl", { class: "facts" }, fact("Type", e.type || "—"), fact("Kind", e.kind || "—"),
          fact("Message", el("span", { class: "wrap" }, e.message || ""))),
        el("h3", {}, "Details"), payloadView(e.details),
      ] : el("p", { class: "muted" }, "None."));
      const hist = a.history || [];
      patch(historyBody, hist, () => hist.length ? hist.map(historyRow) : [messageRow(7, "No attempts yet.")]);
    };
    return root;
  }

  const fact = (label, value) => [el("dt", {}, label), el("dd", {}, value)];

  function payloadView(p) {
    if (!p) return el("p", { class: "muted" }, "None.");
    return [
      el("p", { class: "payload-meta muted small" }, p.content_type || "unknown content type", " · ", fmtBytes(p.size),
        p.truncated ? el("span", { class: "truncated" }, " · truncated, only the beginning is shown") : null),
      el("pre", { class: "payload" }, p.text ?? ""),
    ];
  }

  function historyRow(h) {
    const started = Date.parse(h.started_at), ended = Date.parse(h.ended_at);
    const outcome = String(h.outcome || "unknown");
    return el("tr", { "data-attempt": String(h.attempt) },
      el("td", { class: "num" }, String(h.attempt)),
      el("td", {}, el("span", { class: "outcome outcome-" + outcome }, outcome)),
      el("td", {}, timeEl(h.started_at)),
      el("td", {}, timeEl(h.ended_at)),
      el("td", { class: "num" }, h.started_at && h.ended_at ? fmtDuration(ended - started) : "—"),
      el("td", { title: h.worker_id || "" }, h.identity || h.worker_id || "—",
        h.node ? el("span", { class: "muted" }, " · " + h.node) : null),
      el("td", { class: "err" }, errorCell(h.error)));
  }

  // ---- Page: dead letters -----------------------------------------------------------

  function pageDeadLetters() {
    const ns = state.namespace, live = liveCheck(), writable = canWrite();
    const selected = new Set(); // survives re-renders, pruned to visible rows
    let rows = [], byKey = new Map();

    const selectAll = el("input", { type: "checkbox", id: "select-all", "aria-label": "Select all" });
    const retrySel = el("button", { type: "button", id: "retry-selected", class: "primary", hidden: !writable, disabled: true }, "Re-drive selected");
    const cancelSel = el("button", { type: "button", id: "cancel-selected", class: "danger", hidden: !writable, disabled: true }, "Cancel selected");
    const selInfo = el("span", { class: "muted small" });
    const more = el("p", { class: "muted small", hidden: true },
      "Only the newest failures are listed; use the Activities page to search for older ones.");
    const tbody = el("tbody", {}, messageRow(8, "Loading…", "loading muted"));

    const sync = () => {
      for (const box of tbody.querySelectorAll("input.select")) {
        box.checked = selected.has(box.closest("tr").getAttribute("data-key"));
      }
      selectAll.checked = rows.length > 0 && selected.size === rows.length;
      selectAll.indeterminate = selected.size > 0 && selected.size < rows.length;
      retrySel.disabled = cancelSel.disabled = !writable || selected.size === 0;
      selInfo.textContent = selected.size ? `${selected.size} selected` : "";
    };
    selectAll.addEventListener("change", () => {
      if (selectAll.checked) rows.forEach((a) => selected.add(keyOf(a))); else selected.clear();
      sync();
    });

    const act = async (kind, keys) => {
      const pairs = keys.map((k) => byKey.get(k)).filter(Boolean)
        .map((a) => ({ workflow_id: a.workflow_id, activity_id: a.activity_id }));
      if (!pairs.length) return;
      retrySel.disabled = cancelSel.disabled = true;
      try {
        const results = await bulkAction(kind, ns, pairs);
        for (const r of results) if (r.ok) selected.delete(`${r.workflow_id}/${r.activity_id}`);
      } catch (e) {
        reportError(e);
      }
      sync();
      runRefresh();
    };
    retrySel.addEventListener("click", () => act("retry", [...selected]));
    cancelSel.addEventListener("click", () => act("cancel", [...selected]));

    const row = (a) => {
      const key = keyOf(a);
      const box = el("input", { type: "checkbox", class: "select", "aria-label": "Select " + key, "data-focus": "select:" + key });
      box.checked = selected.has(key);
      box.addEventListener("change", () => { if (box.checked) selected.add(key); else selected.delete(key); sync(); });
      const one = el("button", { type: "button", class: "retry-one small", hidden: !writable, disabled: !writable, "data-focus": "retry:" + key }, "Re-drive");
      one.addEventListener("click", () => act("retry", [key]));
      return el("tr", { "data-key": key },
        el("td", { class: "check" }, box),
        el("td", { class: "key" }, el("a", { href: detailHref(a.namespace || ns, a.workflow_id, a.activity_id), "data-focus": "link:" + key }, key)),
        el("td", {}, a.activity_type),
        el("td", { class: "num" }, attemptText(a)),
        el("td", {}, timeEl(a.finished_at)),
        el("td", {}, a.last_error ? a.last_error.type || "—" : "—"),
        el("td", { class: "err" }, a.last_error ? el("span", { title: a.last_error.message || "" }, cut(a.last_error.message || "", 80)) : "—"),
        el("td", {}, one));
    };

    const root = el("section", { "data-page": "dead-letters" },
      el("h1", {}, "Dead letters ", el("span", { class: "ns-tag" }, ns || "all namespaces")),
      el("p", { class: "muted" }, "Activities that failed for good. Re-drive them to schedule a fresh attempt."),
      el("div", { class: "toolbar" }, retrySel, cancelSel, selInfo),
      tableWrap(el("table", { id: "dead-letters" },
        thead([["", "check"], "Activity", "Type", ["Attempts", "num"], "Finished", "Error type", "Message", ""]), tbody)),
      more);
    root.querySelector("thead th").appendChild(selectAll);

    state.refresh = async () => {
      const d = await api("/api/activities?" + qs({ namespace: ns, status: "FAILED", page_size: 100 }));
      if (!live()) return false;
      rows = d.activities || [];
      byKey = new Map(rows.map((a) => [keyOf(a), a]));
      for (const k of [...selected]) if (!byKey.has(k)) selected.delete(k);
      patch(tbody, rows, () => rows.length ? rows.map(row) : [messageRow(8, "No failed activities. Nothing to re-drive.")]);
      more.hidden = !d.next_page_token;
      sync();
    };
    return root;
  }

  // ---- Page: workers ---------------------------------------------------------------

  function pageWorkers() {
    const ns = state.namespace, live = liveCheck();
    const drainState = el("p", { id: "drain-state", class: "loading muted" }, "Loading…");
    const tbody = el("tbody", {}, messageRow(7, "Loading…", "loading muted"));
    const root = el("section", { "data-page": "workers" },
      el("h1", {}, "Workers ", el("span", { class: "ns-tag" }, ns || "all namespaces")),
      drainState,
      tableWrap(el("table", { id: "workers" },
        thead(["Identity", "Node", "Namespace", "Types", "Slots", "Connected", "Last seen"]), tbody)));

    state.refresh = async () => {
      const d = await api("/api/workers?" + qs({ namespace: ns }));
      if (!live()) return false;
      showDrainState(drainState, d.draining);
      const ws = d.workers || [];
      patch(tbody, ws, () => ws.length ? ws.map(workerRow) : [messageRow(7, "No workers connected.")]);
    };
    return root;
  }

  function showDrainState(node, draining) {
    node.className = draining ? "banner warn" : "banner ok";
    node.textContent = draining
      ? "This node is draining: it hands out no new work until it is resumed."
      : "This node is accepting work.";
  }

  function workerRow(w) {
    const max = Number(w.max_concurrency) || 0, used = Number(w.in_flight) || 0;
    const pct = max > 0 ? Math.min(100, (used / max) * 100) : 0;
    const bar = svg("svg", { class: "bar", viewBox: "0 0 100 6", preserveAspectRatio: "none", "aria-hidden": "true" },
      svg("rect", { class: "bar-bg", width: 100, height: 6, rx: 3 }),
      svg("rect", { class: pct >= 100 ? "bar-fill full" : "bar-fill", width: pct.toFixed(1), height: 6, rx: 3 }));
    return el("tr", { "data-worker": w.worker_id },
      el("td", { title: w.worker_id }, w.identity || w.worker_id),
      el("td", {}, w.node || "—"),
      el("td", {}, w.namespace),
      el("td", { class: "wrap" }, (w.activity_types || []).join(", ")),
      el("td", { class: "slots" }, el("span", { class: "num" }, `${used} / ${max}`), " ", bar),
      el("td", {}, timeEl(w.connected_at)),
      el("td", {}, timeEl(w.last_seen_at)));
  }

  // ---- Page: limits ---------------------------------------------------------------

  // A limit's key: its own, or what the type's limit covers (`none`).
  function keyCell(key, none) {
    return key ? el("td", {}, key) : el("td", { class: "muted" }, none);
  }

  function pageLimits() {
    const ns = state.namespace, live = liveCheck();
    const rateBody = el("tbody", {}, messageRow(7, "Loading…", "loading muted"));
    const keyBody = el("tbody", {}, messageRow(9, "Loading…", "loading muted"));
    const fairBody = el("tbody", {}, messageRow(4, "Loading…", "loading muted"));
    const root = el("section", { "data-page": "limits" },
      el("h1", {}, "Limits ", el("span", { class: "ns-tag" }, ns || "all namespaces")),
      el("h2", {}, "Rate limits"),
      tableWrap(el("table", { id: "rate-limits" },
        thead(["Namespace", "Type", "Key", ["Limit", "num"], ["Burst", "num"], ["Available now", "num"], ""]), rateBody)),
      el("h2", {}, "Concurrency limits"),
      tableWrap(el("table", { id: "concurrency-limits" },
        thead(["Namespace", "Type", "Key", ["Per key", "num"], ["Weight", "num"], "Beyond it", ["Keys", "num"], ["Running", "num"], ["Held back", "num"]]), keyBody)),
      el("h2", {}, "Fairness weights"),
      tableWrap(el("table", { id: "fairness-weights" },
        thead(["Namespace", "Type", "Fairness key", ["Weight", "num"], ["Waiting", "num"]]), fairBody)));

    state.refresh = async () => {
      const d = await api("/api/limits?" + qs({ namespace: ns }));
      if (!live()) return false;
      const rate = d.rate_limits || [], keyed = d.concurrency_limits || [], fair = d.fairness_weights || [];
      patch(rateBody, rate, () => rate.length ? rate.map((l) =>
        el("tr", { "data-type": l.activity_type, "data-key": l.concurrency_key || "" },
          el("td", {}, l.namespace),
          el("td", {}, l.activity_type),
          keyCell(l.concurrency_key, "the whole type"),
          el("td", { class: "num" }, `${fmtNum(l.limit)} / ${l.period || "?"}`),
          el("td", { class: "num" }, fmtNum(l.burst)),
          el("td", { class: "num" }, fmtNum(l.available)),
          el("td", { class: "muted" }, Number(l.available) === 0 ? "throttling" : ""))) :
        [messageRow(7, "No rate limits. Set one with: spool rate-limit set TYPE --limit N --per 1s")]);
      patch(keyBody, keyed, () => keyed.length ? keyed.map((l) =>
        el("tr", { "data-type": l.activity_type, "data-key": l.concurrency_key || "" },
          el("td", {}, l.namespace),
          el("td", {}, l.activity_type),
          keyCell(l.concurrency_key, "every key"),
          el("td", { class: "num" }, Number(l.max_running) ? fmtNum(l.max_running) : "type's"),
          el("td", { class: "num" }, l.concurrency_key ? fmtNum(l.weight) : ""),
          el("td", {}, l.strategy),
          el("td", { class: "num" }, fmtNum(l.keys)),
          el("td", { class: "num" }, fmtNum(l.running)),
          el("td", { class: "num" }, fmtNum(l.held)))) :
        [messageRow(9, "No concurrency limits. Set one with: spool concurrency-limit set TYPE --max N")]);
      patch(fairBody, fair, () => fair.length ? fair.map((w) =>
        el("tr", { "data-type": w.activity_type, "data-key": w.fairness_key },
          el("td", {}, w.namespace),
          el("td", {}, w.activity_type),
          el("td", {}, w.fairness_key),
          el("td", { class: "num" }, fmtNum(w.weight)),
          el("td", { class: "num", title: w.waiting_truncated ? "counted among the type's first 100,000 waiting activities" : "" },
            (w.waiting_truncated ? "≥ " : "") + fmtNum(w.waiting)))) :
        [messageRow(5, "No fairness weights: each activity's own fairness weight counts. Set one with: spool fairness-weight set TYPE --key K --weight N")]);
    };
    return root;
  }

  // ---- Page: drain ---------------------------------------------------------------

  function pageDrain() {
    const root = el("section", { "data-page": "drain" }, el("h1", {}, "Drain"));
    if (!state.session.can_admin) {
      append(root, [el("p", { class: "banner warn" }, "Draining and resuming the node requires the admin role.")]);
      return root;
    }
    const live = liveCheck(), ro = !!state.session.read_only;
    const drainState = el("p", { id: "drain-state", class: "loading muted" }, "Loading…");
    const timeout = el("input", { id: "drain-timeout", type: "number", min: 0, step: 1, value: 30, inputmode: "numeric" });
    const drain = el("button", { type: "button", id: "drain", class: "danger", disabled: ro }, "Drain");
    const resume = el("button", { type: "button", id: "resume", disabled: ro }, "Resume");

    drain.addEventListener("click", async () => {
      const secs = Number(timeout.value);
      if (timeout.value.trim() === "" || !Number.isFinite(secs) || secs < 0) {
        flash("Enter the drain timeout as a number of seconds (0 or more).", { error: true });
        return;
      }
      if (!confirm(`Drain this node? It stops handing out work and waits up to ${secs} s for in-flight activities; the rest are released.`)) return;
      drain.disabled = resume.disabled = true;
      drain.textContent = "Draining…";
      try {
        const r = await api("/api/drain", { timeout_seconds: Math.floor(secs) });
        const otherwise = r.ended_otherwise ? `, ${fmtNum(r.ended_otherwise)} ended otherwise` : "";
        flash(`Drain finished: ${fmtNum(r.completed)} completed, ${fmtNum(r.released)} released${otherwise}.`);
      } catch (e) {
        reportError(e);
      } finally {
        drain.disabled = resume.disabled = ro;
        drain.textContent = "Drain";
      }
      if (live()) runRefresh();
    });

    resume.addEventListener("click", async () => {
      resume.disabled = true;
      try {
        const r = await api("/api/resume", {});
        flash(r.was_draining ? "Resumed: the node accepts work again." : "Resumed: the node was not draining.");
      } catch (e) {
        reportError(e);
      } finally {
        resume.disabled = ro;
      }
      if (live()) runRefresh();
    });

    append(root, [
      drainState,
      el("p", { class: "muted" },
        "Draining stops this node from handing out new work and waits for in-flight activities " +
        "up to the timeout; activities still running then are released back to the queue."),
      ro ? el("p", { class: "banner warn" }, "The dashboard is read-only; drain and resume are disabled.") : null,
      el("div", { class: "filters" }, field("Timeout (seconds)", timeout),
        el("div", { class: "field field-button" }, el("div", { class: "toolbar" }, drain, resume))),
    ]);

    state.refresh = async () => {
      const d = await api("/api/workers?" + qs({ namespace: state.namespace }));
      if (!live()) return false;
      showDrainState(drainState, d.draining);
    };
    return root;
  }

  function pageNotFound() {
    return el("section", { "data-page": "not-found" }, el("h1", {}, "Page not found"),
      el("p", {}, el("a", { href: "#/overview" }, "Go to the overview")));
  }

  // ---- Boot ---------------------------------------------------------------

  async function boot() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => showSignIn(""));
    window.addEventListener("hashchange", route);
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") runRefresh(); else stopPolling();
    });

    // Namespace applies on Enter/blur, or shortly after typing stops.
    const nsInput = $("namespace");
    let nsTimer = null;
    const applyNamespace = () => {
      clearTimeout(nsTimer);
      const v = nsInput.value.trim();
      if (v === state.namespace) return;
      state.namespace = v;
      sessionStorage.setItem(NS_KEY, v);
      // The detail view carries its own namespace in the hash.
      if (parseHash().path !== "activity") route();
    };
    nsInput.addEventListener("change", applyNamespace);
    nsInput.addEventListener("keydown", (e) => { if (e.key === "Enter") applyNamespace(); });
    nsInput.addEventListener("input", () => { clearTimeout(nsTimer); nsTimer = setTimeout(applyNamespace, 600); });

    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token === null) {
      // A server without tokens opens straight onto the app; one with them
      // asks for one.
      try {
        enterApp(await api("/api/session", undefined, true));
      } catch (e) {
        showSignIn(e.status === 401 ? "" : e.message);
      }
      return;
    }
    state.token = token;
    try {
      enterApp(await api("/api/session"));
    } catch (e) {
      if (e.status !== 401) showSignIn(e.message);
    }
  }

  boot();
})();
