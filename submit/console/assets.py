"""The console's stylesheet and script, served from the console itself (no build step,
nothing fetched from elsewhere: the page's Content-Security-Policy allows only 'self')."""

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
header { background: #1a73e8; padding: 8px 16px; }
header a { color: #fff; font-weight: 600; text-decoration: none; }
main { padding: 8px 16px 32px; max-width: 1200px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #e0e0e0; padding: 4px 10px; text-align: left; }
th { background: #f5f5f5; font-weight: 600; }
.empty { color: #777; }
.label { background: #eef3fd; border-radius: 3px; padding: 0 4px; margin-right: 4px; }
.state.SUCCEEDED { color: #188038; } .state.FAILED { color: #d93025; }
.state.RUNNING, .state.PREPARING { color: #1a73e8; } .state.CANCELLED { color: #777; }
.error { color: #d93025; } .note { color: #555; }
pre { background: #f8f9fa; border: 1px solid #e0e0e0; padding: 8px; overflow: auto; }
#logs { height: 320px; font-size: 12px; white-space: pre; }
.chart { margin: 4px 12px 4px 0; border: 1px solid #eee; }
#curves-last { font-size: 12px; }
#cancel { float: right; } #cancel button { background: #d93025; color: #fff;
  border: 0; padding: 6px 14px; border-radius: 4px; cursor: pointer; }
"""

JS = r"""
"use strict";
(function () {
  const job = document.body.dataset.job;
  if (!job) {  // the jobs list: refresh its rows
    const rows = document.querySelector("#jobs tbody");
    if (!rows) return;
    setInterval(() => {
      fetch("rows" + window.location.search).then(r => r.ok ? r.text() : null)
        .then(t => { if (t !== null) rows.innerHTML = t; }).catch(() => {});
    }, 3000);
    return;
  }
  // relative to the page's <base>: the console's own path (guard.py)
  const base = "jobs/" + encodeURIComponent(job);
  const live = document.getElementById("live");
  function done() {
    const s = document.getElementById("state");
    return s && s.dataset.done === "1";
  }
  const curves = document.getElementById("curves");
  function drawCurves() {  // the charts from the job's summaries, read on by the server
    return fetch(base + "/curves").then(r => r.ok ? r.text() : null).then(t => {
      if (t !== null) curves.innerHTML = t;
    }).catch(() => {});
  }
  const curvesPoll = curves && !done() ? setInterval(drawCurves, 5000) : null;
  if (curves && done()) curves.dataset.final = "1";
  const poll = setInterval(() => {
    fetch(base + "/live").then(r => r.ok ? r.text() : null).then(t => {
      if (t === null) return;
      live.innerHTML = t;
      if (done()) {
        clearInterval(poll);
        const cancel = document.getElementById("cancel");
        if (cancel) cancel.remove();
        if (curvesPoll !== null) {  // the last summaries, once
          clearInterval(curvesPoll);
          drawCurves().then(() => { curves.dataset.final = "1"; });
        }
      }
    }).catch(() => {});
  }, 2000);
  const pre = document.getElementById("logs");
  const picker = document.getElementById("task");
  let source = null;
  function follow() {
    if (source) source.close();
    pre.textContent = "";
    delete pre.dataset.ended;
    const task = picker.value;
    source = new EventSource(base + "/logs" + (task ? "?task=" + encodeURIComponent(task) : ""));
    source.onmessage = e => {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(e.data + "\n"));
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    };
    source.addEventListener("note", e => {
      pre.appendChild(document.createTextNode("-- " + e.data + "\n"));
    });
    source.addEventListener("end", e => {
      source.close();
      pre.dataset.ended = e.data;
      pre.appendChild(document.createTextNode("-- job " + e.data + "\n"));
    });
  }
  picker.addEventListener("change", follow);
  follow();
})();
"""
