// The tape page's script (ag_tape_html): draws the graph and the panels from the JSON the
// library wrote into the page (element #tape-data; its fields are described in
// src/io/tape_html.c). Built into the library as text: see tape_html.c.
//
// Names are the user's text: they reach the page through textContent and attributes set
// with setAttribute, never as markup. Numbers are shown as the library wrote them.
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('tape-data').textContent);
  var N = D.nodes.length, T = D.tensors, G = D.groups;
  var SVG = 'http://www.w3.org/2000/svg';  // a namespace name, never fetched

  // ---- Small helpers -----------------------------------------------------------------
  function el(tag, attrs) {
    var e = document.createElement(tag);
    setAttrs(e, attrs);
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  function sv(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    setAttrs(e, attrs);
    return e;
  }
  function setAttrs(e, attrs) {
    for (var k in attrs || {})
      if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, String(attrs[k]));
  }
  function add(e, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) c.forEach(function (x) { add(e, x); });
    else e.appendChild(typeof c === 'string' || typeof c === 'number'
                       ? document.createTextNode(String(c)) : c);
  }
  function clip(s, n) { return s.length <= n ? s : s.slice(0, Math.max(1, n - 1)) + '\u2026'; }

  // ---- What the tape holds ----------------------------------------------------------
  var consumers = T.map(function () { return []; });  // [node, input slot] for each tensor
  D.nodes.forEach(function (nd, i) {
    nd.in.forEach(function (id, k) { consumers[id].push([i, k]); });
  });
  function tname(id) {
    var t = T[id];
    if (t.name) return t.name;
    if (t.node >= 0) return '#' + t.node + ' ' + D.nodes[t.node].op;
    var c = consumers[id][0];
    return c ? 'input ' + c[1] + ' of #' + c[0] : 'tensor ' + id;
  }
  function isLeaf(id) { return T[id].node < 0; }

  var groupOf = [];
  for (var i = 0; i < N; i++) groupOf.push(-1);
  G.forEach(function (g, gi) {
    for (var j = g.first; j < g.first + g.count; j++) groupOf[j] = gi;
  });
  var open = G.map(function () { return false; });  // groups the reader opened
  var autoOpen = -1;                                   // the group stepping opened

  // ---- The page's frame -------------------------------------------------------------
  var nFailed = 0;
  D.nodes.forEach(function (nd) { if (nd.check && !nd.check.ok) nFailed++; });
  var nLeaves = T.filter(function (t) { return t.node < 0; }).length;
  var summary = N + ' node' + (N === 1 ? '' : 's') + ', ' + nLeaves + ' lea' +
      (nLeaves === 1 ? 'f' : 'ves') + ' \u00b7 ' +
      (!D.checked ? 'not checked'
                  : nFailed === 1 ? '1 node failed its check'
                  : nFailed ? nFailed + ' nodes failed their check'
                  : 'every node passed its check');
  function button(id, label, title) {
    return el('button', {id: id, type: 'button', title: title, 'aria-label': title}, label);
  }
  var stepLabel = el('span', {id: 'step', 'aria-live': 'polite'});
  var fwdButton = button('forward', 'forward', 'the forward pass, at this node (f)');
  var bwdButton = button('backward', 'backward', 'the backward pass, at this node (b)');
  var bar = el('header', {id: 'bar'},
    el('h1', {id: 'title', title: D.title}, D.title),
    el('span', {id: 'summary'}, summary),
    el('div', {id: 'controls', role: 'group', 'aria-label': 'steps'},
      button('first', 'first', 'first step (Home)'),
      button('prev', '\u25c0 back', 'previous step (left arrow or k)'),
      stepLabel,
      button('next', 'next \u25b6', 'next step (right arrow or j)'),
      button('last', 'last', 'last step (End)'),
      fwdButton, bwdButton),
    el('div', {id: 'keys'}, 'The forward pass node by node, then the backward pass. Keys: ' +
       '\u2192 \u2190 (j k) step, Home End, f b: this node\u2019s forward or backward; ' +
       'Tab, Enter: a box. A link to a step ends in #f3 or #b3.'));
  var graphPane = el('div', {id: 'graph-pane'});
  var panel = el('main', {id: 'panel', 'aria-live': 'polite'});
  document.body.appendChild(bar);
  document.body.appendChild(el('div', {id: 'main'}, graphPane, panel));

  // ---- Steps: forward 0 .. N-1, then backward N-1 .. 0 ------------------------------
  var step = 0;
  function nodeOf(s) { return s < N ? s : 2 * N - 1 - s; }
  function passOf(s) { return s < N ? 'f' : 'b'; }
  function stepOf(node, pass) { return pass === 'f' ? node : 2 * N - 1 - node; }

  // ---- The graph --------------------------------------------------------------------
  var BOX_H = 56, GAP_Y = 26, GAP_X = 12, LANES_W = 30;
  var boxes = {}, edgeEls = [], unitOfNode = [];

  function unitKey(i) {
    var g = groupOf[i];
    return g >= 0 && !open[g] && autoOpen !== g ? 'g' + g : 'n' + i;
  }
  function isOpen(g) { return open[g] || autoOpen === g; }

  function layout() {
    // The box that has the keyboard's focus is drawn anew: the focus goes to its new box
    // (a group opened: to its first node; closed: to the group), not back to the page's top.
    var had = graphPane.contains(document.activeElement) ? document.activeElement : null;
    var hadNode = had && had.getAttribute('data-node');
    var hadGroup = had && had.getAttribute('data-group');
    var width = Math.max(240, graphPane.clientWidth);
    var units = [], index = {};
    for (var i = 0; i < N; i++) {
      var key = unitKey(i);
      if (!(key in index)) {
        index[key] = units.length;
        units.push({key: key, nodes: [], preds: [], layer: 0});
      }
      unitOfNode[i] = index[key];
      units[index[key]].nodes.push(i);
    }
    var edges = {}, edgeList = [];
    D.nodes.forEach(function (nd, i) {
      nd.in.forEach(function (id) {
        var j = T[id].node;
        if (j < 0) return;
        var a = unitOfNode[j], b = unitOfNode[i];
        if (a === b) return;
        var key = a + '>' + b;
        if (!edges[key]) {
          edges[key] = {a: a, b: b, pairs: []};
          edgeList.push(edges[key]);
          units[b].preds.push(a);
        }
        edges[key].pairs.push([j, i]);
      });
    });
    // Layers: one below the lowest of a unit's inputs (units come in tape order, which
    // is already topological, and a group is a run of consecutive nodes).
    var layers = [];
    units.forEach(function (u) {
      u.preds.forEach(function (a) { u.layer = Math.max(u.layer, units[a].layer + 1); });
      (layers[u.layer] = layers[u.layer] || []).push(u);
    });
    // Boxes a row: as many as fit, at most 3 wide enough to read.
    var inner = width - 2 * LANES_W;
    var perRow = Math.max(1, Math.min(3, Math.floor((inner + GAP_X) / (150 + GAP_X))));
    var boxW = Math.min(220, Math.floor((inner - (perRow - 1) * GAP_X) / perRow));
    var y = 10, row = 0;
    layers.forEach(function (layer) {
      // Below their inputs: ordered by where their inputs sit.
      layer.forEach(function (u, k) {
        var xs = u.preds.map(function (a) { return units[a].x; });
        u.order = xs.length ? xs.reduce(function (s, x) { return s + x; }, 0) / xs.length
                            : k * 1e-3;
      });
      layer.sort(function (p, q) { return p.order - q.order; });
      for (var start = 0; start < layer.length; start += perRow) {
        var part = layer.slice(start, start + perRow);
        var rowW = part.length * boxW + (part.length - 1) * GAP_X;
        var x0 = LANES_W + Math.max(0, Math.floor((inner - rowW) / 2));
        part.forEach(function (u, k) {
          u.x = x0 + k * (boxW + GAP_X);
          u.y = y;
          u.w = boxW;
          u.row = row;
        });
        y += BOX_H + GAP_Y;
        row++;
      }
    });
    var height = Math.max(y, 100);

    var svg = sv('svg', {id: 'graph', width: width, height: height, role: 'list',
                         'aria-label': 'the tape, top to bottom'});
    var defs = sv('defs');
    [['arrow', 'marker', 'auto'], ['arrow-f', 'fwd', 'auto'],
     ['arrow-g', 'grad', 'auto-start-reverse']].forEach(function (m) {
      var mk = sv('marker', {id: m[0], viewBox: '0 0 10 10', refX: 9, refY: 5,
                             markerWidth: 7, markerHeight: 7, orient: m[2]});
      var path = sv('path', {d: 'M0,0 L10,5 L0,10 z'});
      path.setAttribute('style', m[1] === 'marker' ? 'fill:#9aa3b2'
                                 : m[1] === 'fwd' ? 'fill:#2b8a3e' : 'fill:#d9480f');
      mk.appendChild(path);
      defs.appendChild(mk);
    });
    svg.appendChild(defs);

    // Frames around the open groups, under everything else.
    G.forEach(function (g, gi) {
      if (!isOpen(gi)) return;
      var members = [];
      for (var j = g.first; j < g.first + g.count; j++) members.push(units[unitOfNode[j]]);
      var x1 = Math.min.apply(null, members.map(function (u) { return u.x; })) - 6;
      var y1 = Math.min.apply(null, members.map(function (u) { return u.y; })) - 16;
      var x2 = Math.max.apply(null, members.map(function (u) { return u.x + u.w; })) + 6;
      var y2 = Math.max.apply(null, members.map(function (u) { return u.y; })) + BOX_H + 6;
      svg.appendChild(sv('rect', {class: 'frame-open', x: x1, y: y1, width: x2 - x1,
                                  height: y2 - y1, rx: 8}));
      var label = sv('text', {class: 'frame-label', x: x1 + 6, y: y1 + 11, tabindex: 0,
                              role: 'button', 'data-group': gi});
      label.textContent = groupTitle(g) + ' \u2014 close';
      label.addEventListener('click', function () { closeGroup(gi); });
      label.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); closeGroup(gi); }
      });
      svg.appendChild(label);
    });

    // Edges: a short one straight down, a long one (past other rows) down a lane in the
    // margin on its side, so that it crosses no box.
    var laneEnd = {left: [], right: []};
    edgeEls = [];
    edgeList.sort(function (p, q) { return units[p.a].row - units[q.a].row; });
    edgeList.forEach(function (e) {
      var a = units[e.a], b = units[e.b];
      var sx = a.x + a.w / 2, sy = a.y + BOX_H, tx = b.x + b.w / 2, ty = b.y;
      var d;
      if (b.row - a.row <= 1) {
        var dy = Math.max(12, (ty - sy) / 2);
        d = 'M' + sx + ',' + sy + ' C' + sx + ',' + (sy + dy) + ' ' + tx + ',' + (ty - dy) +
            ' ' + tx + ',' + ty;
      } else {
        var side = sx > width / 2 ? 'right' : 'left', ends = laneEnd[side], lane = 0;
        while (ends[lane] !== undefined && ends[lane] > a.row) lane++;
        ends[lane] = b.row;
        var lx = side === 'left' ? 6 + (lane % 5) * 5 : width - 6 - (lane % 5) * 5;
        d = 'M' + sx + ',' + sy + ' C' + sx + ',' + (sy + 14) + ' ' + lx + ',' + (sy + 2) +
            ' ' + lx + ',' + (sy + 20) + ' L' + lx + ',' + (ty - 20) + ' C' + lx + ',' +
            (ty - 2) + ' ' + tx + ',' + (ty - 14) + ' ' + tx + ',' + ty;
      }
      var path = sv('path', {class: 'edge', d: d, 'marker-end': 'url(#arrow)'});
      path.pairs = e.pairs;
      svg.appendChild(path);
      edgeEls.push(path);
    });

    boxes = {};
    units.forEach(function (u) {
      var g = u.key.charAt(0) === 'g' ? +u.key.slice(1) : -1;
      var box = g >= 0 ? groupBox(u, G[g], g) : nodeBox(u, u.nodes[0]);
      svg.appendChild(box);
      boxes[u.key] = box;
    });
    graphPane.textContent = '';
    graphPane.appendChild(svg);
    var next = hadNode !== null && hadNode !== undefined ? boxes[unitKey(+hadNode)]
             : hadGroup !== null && hadGroup !== undefined
               ? boxes['g' + hadGroup] || boxes[unitKey(G[+hadGroup].first)] : null;
    if (next) next.focus();
  }

  function texts(box, u, lines) {
    var chars = Math.floor((u.w - 14) / 7.3);
    lines.forEach(function (line, k) {
      if (!line[0]) return;
      var t = sv('text', {x: u.x + 7, y: u.y + 17 + 16 * k, class: line[1]});
      t.textContent = clip(line[0], chars);
      box.appendChild(t);
    });
  }

  function nodeBox(u, i) {
    var nd = D.nodes[i], out = T[nd.out];
    var leaves = nd.in.filter(isLeaf).map(tname);
    var box = sv('g', {class: 'box', tabindex: 0, role: 'listitem', 'data-node': i,
                       'aria-label': '#' + i + ' ' + nd.op + ': ' + tname(nd.out) + ' ' +
                                     out.shape});
    box.appendChild(sv('rect', {class: 'frame', x: u.x, y: u.y, width: u.w, height: BOX_H,
                                rx: 6}));
    var mark = !nd.check ? '' : nd.check.verdict === 'inconclusive' ? '  ? check'
                              : nd.check.ok ? '  \u2713' : '  \u2717 check';
    texts(box, u, [['#' + i + ' ' + nd.op + mark, 'op'],
                   [(out.name ? out.name + ' ' : '') + out.shape, ''],
                   [leaves.length ? '\u2190 ' + leaves.join(', ') : '', 'sub']]);
    if (nd.check && !nd.check.ok) box.classList.add('failed');
    box.addEventListener('click', function () { go(stepOf(i, passOf(step))); });
    box.addEventListener('keydown', function (e) {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); go(stepOf(i, passOf(step))); }
    });
    return box;
  }

  function groupTitle(g) {
    return g.copies ? (g.through > g.copy ? 'blocks ' + g.copy + '\u2013' + g.through
                                          : 'block ' + g.copy) + ' of ' + g.copies
                    : 'nodes #' + g.first + '\u2013#' + (g.first + g.count - 1);
  }

  function groupBox(u, g, gi) {
    var ops = [];
    for (var j = g.first; j < g.first + g.count; j++)
      if (ops.indexOf(D.nodes[j].op) < 0) ops.push(D.nodes[j].op);
    var box = sv('g', {class: 'box group', tabindex: 0, role: 'listitem', 'data-group': gi,
                       'aria-expanded': 'false',
                       'aria-label': groupTitle(g) + ', ' + g.count + ' nodes: open'});
    box.appendChild(sv('rect', {class: 'frame', x: u.x, y: u.y, width: u.w, height: BOX_H,
                                rx: 6}));
    texts(box, u, [['\u229e #' + g.first + '\u2013#' + (g.first + g.count - 1) + ', ' +
                    g.count + ' nodes', 'op'],
                   [groupTitle(g), ''], [ops.join(', '), 'sub']]);
    function toggle() { open[gi] = true; layout(); highlight(); }
    box.addEventListener('click', toggle);
    box.addEventListener('keydown', function (e) {
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(); }
    });
    return box;
  }

  function closeGroup(gi) {
    open[gi] = false;
    if (autoOpen === gi) autoOpen = -1;
    layout();
    highlight();
  }

  // The current node's box and the edges of this step: in the forward pass those that
  // bring its inputs, in the backward pass those its gradient goes back along.
  function highlight() {
    var c = nodeOf(step), pass = passOf(step);
    Object.keys(boxes).forEach(function (key) {
      var box = boxes[key], g = key.charAt(0) === 'g';
      var nodes = g ? [] : [+key.slice(1)];
      if (g) {
        var grp = G[+key.slice(1)];
        for (var j = grp.first; j < grp.first + grp.count; j++) nodes.push(j);
      }
      var has = nodes.indexOf(c) >= 0, last = nodes[nodes.length - 1], first = nodes[0];
      box.classList.toggle('current', has);
      box.classList.toggle('done', !has && (pass === 'b' || last < c));
      box.classList.toggle('grad-done', !has && pass === 'b' && first > c);
      if (has) box.setAttribute('aria-current', 'step');
      else box.removeAttribute('aria-current');
    });
    edgeEls.forEach(function (e) {
      var on = e.pairs.some(function (p) { return p[1] === c; });
      e.classList.toggle('fwd', on && pass === 'f');
      e.classList.toggle('grad', on && pass === 'b');
      // The gradient's edges point back, up to the inputs.
      if (on && pass === 'b') e.removeAttribute('marker-end');
      else e.setAttribute('marker-end', on ? 'url(#arrow-f)' : 'url(#arrow)');
      if (on && pass === 'b') e.setAttribute('marker-start', 'url(#arrow-g)');
      else e.removeAttribute('marker-start');
    });
  }

  function scrollToCurrent() {
    var box = boxes[unitKey(nodeOf(step))];
    if (!box) return;
    var r = box.getBBox(), top = graphPane.scrollTop, h = graphPane.clientHeight;
    if (r.y < top + 8) graphPane.scrollTop = Math.max(0, r.y - 40);
    else if (r.y + r.height > top + h - 8) graphPane.scrollTop = r.y + r.height - h + 40;
  }

  // ---- Numbers ------------------------------------------------------------------------
  // A diverging colour: blue below 0, red above, white at 0, by |v| / scale; lighter under
  // text.
  function colour(v, scale, text) {
    if (isNaN(v)) return text ? '#d8b4f0' : '#7a2aa8';
    if (!isFinite(v)) return text ? '#c8c8c8' : v > 0 ? '#7f0000' : '#08306b';
    var a = scale > 0 ? Math.min(1, Math.abs(v) / scale) : 0;
    var light = Math.round(100 - (text ? 34 : 52) * a);
    return v >= 0 ? 'hsl(8,80%,' + light + '%)' : 'hsl(214,80%,' + light + '%)';
  }
  // The index of entry f of a tensor of these dims, as [i,j,...].
  function unravel(f, dims) {
    var idx = [];
    for (var d = dims.length - 1; d >= 0; d--) {
      idx.unshift(f % dims[d]);
      f = Math.floor(f / dims[d]);
    }
    return '[' + idx.join(',') + ']';
  }

  // A tensor's values (v: a view the library wrote) as a table or a heatmap; `what` names
  // it for whoever reads the page's structure ("value", "grad", "send-0", ...).
  function matrix(v, t, what) {
    var words = v.d ? v.d.split(' ') : [], nums = words.map(Number);
    var scale = 0;
    nums.forEach(function (x) { if (isFinite(x)) scale = Math.max(scale, Math.abs(x)); });
    var dims = t.dims, per = dims.length >= 2 ? dims[dims.length - 2] : v.rows;
    var wrap = el('div', {class: 'matrix', 'data-what': what});
    if (v.full) {
      var table = el('table', {class: 'm'});
      for (var r = 0; r < v.r; r++) {
        if (dims.length > 2 && r % per === 0 && v.rows > per) {
          var lead = unravel(r * v.cols, dims).replace(/,\d+,\d+\]$/, ',:,:]');
          table.appendChild(el('tr', null, el('td', {class: 'sep', colspan: v.c}, lead)));
        }
        var tr = el('tr');
        for (var c = 0; c < v.c; c++) {
          var k = r * v.c + c, f = r * v.cols + c;
          var td = el('td', {'data-i': f, title: unravel(f, dims)}, words[k]);
          td.style.background = colour(nums[k], scale, true);
          tr.appendChild(td);
        }
        table.appendChild(tr);
      }
      wrap.appendChild(table);
    } else {
      var cell = Math.max(3, Math.min(14, Math.floor(600 / v.c), Math.floor(480 / v.r)));
      var heat = sv('svg', {class: 'heat', width: v.c * cell, height: v.r * cell,
                            viewBox: '0 0 ' + v.c * cell + ' ' + v.r * cell,
                            role: 'img', 'aria-label': 'heatmap of ' + v.r + ' x ' + v.c +
                                                       ' entries; hover for values'});
      for (var rr = 0; rr < v.r; rr++)
        for (var cc = 0; cc < v.c; cc++) {
          var kk = rr * v.c + cc, ff = rr * v.cols + cc;
          heat.appendChild(sv('rect', {x: cc * cell, y: rr * cell, width: cell, height: cell,
                                       fill: colour(nums[kk], scale), 'data-i': ff,
                                       'data-v': words[kk]}));
        }
      for (var b = per; dims.length > 2 && b < v.r; b += per)
        heat.appendChild(sv('line', {x1: 0, x2: v.c * cell, y1: b * cell, y2: b * cell,
                                     stroke: '#1d2330', 'stroke-width': 1}));
      var readout = el('div', {class: 'readout'}, 'hover over the map for values');
      heat.addEventListener('mouseover', function (e) {
        var i = e.target.getAttribute('data-i');
        if (i !== null) readout.textContent = unravel(+i, dims) + ' = ' +
                                             e.target.getAttribute('data-v');
      });
      wrap.appendChild(heat);
      wrap.appendChild(readout);
      // The colours that are no size: what they mean, when the map holds them.
      var odd = [];
      if (nums.some(isNaN)) odd.push('NaN purple');
      if (nums.some(function (x) { return x === Infinity; })) odd.push('+infinity dark red');
      if (nums.some(function (x) { return x === -Infinity; })) odd.push('\u2212infinity dark blue');
      if (odd.length) wrap.appendChild(el('div', {class: 'caption legend'}, 'in the map: ' +
                                                                            odd.join(', ')));
    }
    var cap = [];
    if (!v.full)
      cap.push('shown: ' + (v.r < v.rows ? 'rows 0\u2013' + (v.r - 1) + ' of ' + v.rows
                                         : 'all ' + v.rows + ' rows') + ', ' +
               (v.c < v.cols ? 'columns 0\u2013' + (v.c - 1) + ' of ' + v.cols
                             : 'all ' + v.cols + ' columns') +
               ' (the last dim across, the others stacked down)');
    // min and max leave the NaNs out (while any entry is not one); the norm is NaN then.
    var some = v.nan && v.nan < v.rows * v.cols ? ' of those not NaN' : '';
    cap.push((v.full ? '' : 'over all ' + v.rows * v.cols + ' entries: ') + 'min ' + v.min +
             ', max ' + v.max + some + ', norm ' + v.norm +
             (v.nan ? ', ' + v.nan + ' NaN' : '') + (v.inf ? ', ' + v.inf + ' infinite' : '') +
             (v.zeroed ? '; ' + v.zeroed + (v.zeroed === 1 ? ' entry' : ' entries') +
                         ' smaller than ' + D.zero_below + ' shown as 0 (rounding of a 0)'
                       : ''));
    wrap.appendChild(el('div', {class: 'caption'}, cap.join('; ')));
    return wrap;
  }

  // ---- The panel of one node ------------------------------------------------------------
  function link(i, label) {
    var b = el('button', {class: 'link', type: 'button'}, label);
    b.addEventListener('click', function () { go(stepOf(i, passOf(step))); });
    return b;
  }

  function section(title, lead) {
    return el('section', {class: 'section' + (lead ? ' lead' : '')}, el('h3', null, title));
  }

  function forwardSection(i, lead) {
    var nd = D.nodes[i], out = T[nd.out];
    var s = section('Forward: the value of ' + tname(nd.out), lead);
    var list = el('ul', {class: 'inputs'});
    nd.in.forEach(function (id, k) {
      var t = T[id];
      var li = el('li', null, 'input ' + k + ': ', el('span', {class: 'mono'}, tname(id)), ' ',
                  t.dtype + ' ' + t.shape + ' ');
      if (t.node >= 0) add(li, ['from ', link(t.node, '#' + t.node + ' ' +
                                                      D.nodes[t.node].op)]);
      else add(li, t.rg ? '(a leaf that requires grad)' : '(a leaf, constant)');
      if (t.node < 0) {
        var det = el('details', null, el('summary', null, 'its values'),
                     matrix(t.value, t, 'leaf-value'));
        if (t.value.full) det.open = true;
        li.appendChild(det);
      }
      list.appendChild(li);
    });
    s.appendChild(list);
    s.appendChild(el('h4', null, tname(nd.out) + ' = ' + nd.op + '(\u2026), ' + out.dtype +
                                 ' ' + out.shape));
    s.appendChild(matrix(out.value, out, 'value'));
    return s;
  }

  function backwardSection(i, lead) {
    var nd = D.nodes[i], out = T[nd.out];
    var s = section('Backward: the gradient arriving, and what goes back', lead);
    s.appendChild(el('p', null, nd.op ? 'The rule of ' + nd.op + ':' : 'The rule of its op:'));
    s.appendChild(el('code', {class: 'rule'}, nd.rule || '(the op gives no rule)'));
    s.appendChild(el('h4', null, 'arriving at its output' +
                                 (out.name ? ': d(' + out.name + ')' : '')));
    if (out.grad) s.appendChild(matrix(out.grad, out, 'grad'));
    else s.appendChild(el('p', {class: 'meta'}, 'no gradient: this node does not reach the ' +
                                                'loss, or no backward was run'));
    if (!nd.sent) {
      s.appendChild(el('p', {class: 'meta'}, out.grad ? 'the op has no backward'
                                                      : 'nothing is sent'));
      return s;
    }
    if (nd.replay !== '0')
      s.appendChild(el('p', {class: 'bad'}, 'Its replayed forward differs from the recorded ' +
                       'output by ' + nd.replay + ': an input changed since recording, and ' +
                       'what is sent below is from the inputs\u2019 current values.'));
    nd.in.forEach(function (id, k) {
      var v = nd.sends[k], t = T[id];
      if (!v) return;
      s.appendChild(el('h4', null, 'sends to input ' + k + ', ' + tname(id) +
                                   (t.name ? ': d(' + t.name + ')' : '')));
      s.appendChild(matrix(v, t, 'send-' + k));
      // Reads are input slots: x * x reads x twice, in one node.
      var uses = consumers[id].length, readers = [];
      consumers[id].forEach(function (c) {
        if (readers.indexOf(c[0]) < 0) readers.push(c[0]);
      });
      if (t.grad && t.grad.d !== v.d) {
        var why = uses < 2 ? 'its gradient in total (a leaf\u2019s adds up over backward calls ' +
                             'until zeroed)'
                : tname(id) + (readers.length === 1 ? ' is read ' + uses + ' times by this node'
                               : ' is read by ' + readers.length + ' nodes' +
                                 (uses > readers.length ? ', ' + uses + ' times' : '')) +
                  '; its gradient is the sum of what ' +
                  (readers.length === 1 ? 'each read is' : 'they') + ' sent';
        var det = el('details', null, el('summary', null, why), matrix(t.grad, t, 'total'));
        s.appendChild(det);
      }
    });
    return s;
  }

  function checkSection(i) {
    var nd = D.nodes[i], c = nd.check;
    var s = section('Its own finite-difference check', false);
    if (!c) {
      s.appendChild(el('p', {class: 'meta'}, 'Not checked: give ag_tape_check\u2019s report ' +
                                             'to ag_tape_html (opts.check) to see it here.'));
      return s;
    }
    var doubt = c.verdict === 'inconclusive';
    s.appendChild(el('p', null, el('span', {class: c.ok && !doubt ? 'ok' : 'bad'},
                                   doubt ? '? inconclusive'
                                         : c.ok ? '\u2713 passes' : '\u2717 FAILS'), ': ',
                     // Nothing compared has no error to show, not an error of 0.
                     (c.n ? c.n + (c.elem ? ' elements, one by one' : ' random directions') +
                            ', in ' + (c.f64 ? 'float64' : 'float32') + '; largest error ' +
                            c.abs + ' (relative ' + c.rel + ')'
                          : 'nothing compared, in ' + (c.f64 ? 'float64' : 'float32')) +
                     '; ' + c.runs + ' forward run' + (c.runs === 1 ? '' : 's') +
                     (c.twin !== null ? '; against its float64 twin ' + c.twin : '') +
                     (c.nf ? '; ' + c.nf + ' entries not finite, not perturbed' : '') + '.'));
    s.appendChild(el('p', {class: 'meta'}, 'The node alone is run on inputs moved a little ' +
                     'either way; the change of its output, against what its backward says.'));
    if (!c.ok && c.worst >= 0)
      s.appendChild(el('p', null, 'worst at input ' + c.worst + ': differences give ' + c.num +
                                  ', the backward ' + c.ana));
    if (c.note) s.appendChild(el('p', {class: 'bad'}, c.note));
    return s;
  }

  function showPanel() {
    var i = nodeOf(step), nd = D.nodes[i], out = T[nd.out], pass = passOf(step);
    panel.textContent = '';
    panel.appendChild(el('h2', null, '#' + i + ' ' + nd.op +
                                     (out.name ? ' \u2192 ' + out.name : '')));
    panel.appendChild(el('p', {class: 'meta'}, out.dtype + ' ' + out.shape + ' \u00b7 ' +
                         (pass === 'f' ? 'forward pass, step ' + (i + 1) + ' of ' + N
                                       : 'backward pass, step ' + (N - i) + ' of ' + N)));
    out.notes.forEach(function (n) { panel.appendChild(el('p', {class: 'note'}, n)); });
    nd.in.forEach(function (id, k) {
      // A leaf read twice (x * x) has its notes shown once.
      if (T[id].node < 0 && nd.in.indexOf(id) === k)
        T[id].notes.forEach(function (n) {
          panel.appendChild(el('p', {class: 'note'}, tname(id) + ': ' + n));
        });
    });
    if (pass === 'f') {
      panel.appendChild(forwardSection(i, true));
      panel.appendChild(backwardSection(i, false));
    } else {
      panel.appendChild(backwardSection(i, true));
      panel.appendChild(forwardSection(i, false));
    }
    panel.appendChild(checkSection(i));
  }

  // ---- Going to a step ------------------------------------------------------------------
  function go(s) {
    if (!N) return;
    step = Math.max(0, Math.min(2 * N - 1, s));
    // A step into a closed group opens it, and closes it again once the steps leave it.
    var c = nodeOf(step), g = groupOf[c];
    var want = g >= 0 && !open[g] ? g : -1;
    if (want !== autoOpen) {
      autoOpen = want;
      layout();
    }
    highlight();
    showPanel();
    panel.scrollTop = 0;
    scrollToCurrent();
    var pass = passOf(step);
    stepLabel.textContent = (pass === 'f' ? 'forward ' + (c + 1) : 'backward ' + (N - c)) +
                            ' of ' + N + ': #' + c + ' ' + D.nodes[c].op;
    stepLabel.title = stepLabel.textContent;  // in full, where a long op name is cut short
    fwdButton.setAttribute('aria-pressed', String(pass === 'f'));
    bwdButton.setAttribute('aria-pressed', String(pass === 'b'));
    document.body.setAttribute('data-node', c);
    document.body.setAttribute('data-pass', pass);
    if (!hashTimer) {
      var wait = hashWritten + 100 - Date.now();
      if (wait <= 0) writeHash();
      else hashTimer = setTimeout(writeHash, wait);
    }
  }

  // The address names the step, written at most every 100 ms and once more after the
  // last step: a browser ignores a page that rewrites its address faster (Chromium,
  // 200 times in 10 s, as a held arrow key does), and the address would stay behind.
  var hashTimer = 0, hashWritten = 0;
  function writeHash() {
    hashTimer = 0;
    var hash = '#' + passOf(step) + nodeOf(step);
    if (location.hash === hash) return;
    hashWritten = Date.now();
    try {
      history.replaceState(null, '', hash);
    } catch (e) { /* a browser that refuses it for local files: the link still works */ }
  }

  function fromHash() {
    var m = /^#([fb])(\d+)$/.exec(location.hash);
    if (m && +m[2] < N) go(stepOf(+m[2], m[1]));
    else go(step);
  }

  document.getElementById('first').addEventListener('click', function () { go(0); });
  document.getElementById('prev').addEventListener('click', function () { go(step - 1); });
  document.getElementById('next').addEventListener('click', function () { go(step + 1); });
  document.getElementById('last').addEventListener('click', function () { go(2 * N - 1); });
  fwdButton.addEventListener('click', function () { go(stepOf(nodeOf(step), 'f')); });
  bwdButton.addEventListener('click', function () { go(stepOf(nodeOf(step), 'b')); });
  document.addEventListener('keydown', function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    var k = e.key;
    if (k === 'ArrowRight' || k === 'j') go(step + 1);
    else if (k === 'ArrowLeft' || k === 'k') go(step - 1);
    else if (k === 'Home') go(0);
    else if (k === 'End') go(2 * N - 1);
    else if (k === 'f') go(stepOf(nodeOf(step), 'f'));
    else if (k === 'b') go(stepOf(nodeOf(step), 'b'));
    else return;
    e.preventDefault();
  });
  window.addEventListener('hashchange', fromHash);
  var resizeTimer = 0;
  window.addEventListener('resize', function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { layout(); highlight(); }, 100);
  });

  if (!N) {
    panel.appendChild(el('p', null, 'The tape is empty: record some ops (with an input that ' +
                                    'requires grad) before writing the page.'));
    stepLabel.textContent = 'no steps';
    return;
  }
  layout();
  fromHash();
})();
